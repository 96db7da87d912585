"""The id range check inside exported TensorFlow models (SavedModel, and ONNX through tf2onnx).

Why in the graph: TensorFlow's GPU gather returns zeros for an id past the table and ONNX's ``Gather`` wraps a
negative id into ``[-size, -1]``, so on a real Triton server a bad id would silently give a wrong score. The serving
function instead looks up row 0 for an out-of-range id (valid on every device) and scores the whole request row NaN:
the model itself flags the row, on any server. Padding ids of multi-hot inputs (-1) pass with ``lower=-1``.

    safe, row_ok = checked_ids(ids, upper, lower)   # ids [B, H]; upper: int
    probability = flag_rows(probability, row_ok)    # [B, 1]; NaN where a row held an id outside [lower, upper)
"""
import tensorflow as tf


def checked_ids(ids, upper, lower=0):
    """``(ids with every one outside [lower, upper) replaced by 0, row_ok [B] bool)``."""
    upper = tf.cast(upper, ids.dtype)
    valid = tf.logical_and(ids >= tf.cast(lower, ids.dtype), ids < upper)
    safe = tf.where(valid, ids, tf.zeros_like(ids))
    return safe, tf.reduce_all(tf.reshape(valid, [tf.shape(ids)[0], -1]), axis=1)


def all_rows_ok(row_oks):
    """The rows where every one of ``row_oks`` (a list of [B] bool) holds."""
    result = row_oks[0]
    for ok in row_oks[1:]:
        result = tf.logical_and(result, ok)
    return result


def flag_rows(probability, row_ok):
    """``probability`` [B, k] with NaN in the rows where ``row_ok`` is False."""
    # a [B, 1] mask against a scalar NaN, both broadcast by Where: tf2onnx converts this form exactly (with
    # tf.broadcast_to / tf.fill operands its ONNX graph flagged every row)
    return tf.where(tf.reshape(row_ok, [-1, 1]), probability, tf.constant(float("nan"), probability.dtype))
