"""The shared CPU batch / learning-rate rule (issue 18). Pure arithmetic: no training, well under a second."""
import argparse
import math

import pytest

from recsys_common import cpu_defaults as cd

GIB = 2 ** 30
# TF2 DLRM at NVIDIA's defaults: global batch 65536, SGD at lr 24
DLRM = dict(gpu_batch=65536, gpu_learning_rate=24.0, lr_scaling="linear", batch_flag="--batch_size",
            lr_flag="--learning_rate")


def test_steps_per_epoch_bind_on_a_small_dataset_and_sgd_scales_linearly():
    c = cd.choose_cpu_batch(300_000, bytes_per_row=1024, memory_bytes=16 * GIB, **DLRM)
    assert (c.batch, c.binding) == (2048, "steps") and 300_000 // c.batch >= cd.MIN_STEPS_PER_EPOCH
    assert c.learning_rate == pytest.approx(24 * 2048 / 65536)
    assert c.reason == ("--batch_size 2048 (at least 100 steps over 300000 training rows per epoch; NVIDIA's GPU "
                        "default is 65536) and --learning_rate 0.75 (NVIDIA's 24 x 2048/65536)")


def test_memory_binds_a_large_dataset_and_adam_scales_by_the_square_root():
    # 1/8 of 8 GiB at 64 KiB per row: 16384 rows
    c = cd.choose_cpu_batch(10 ** 9, gpu_batch=131072, gpu_learning_rate=0.00048, bytes_per_row=64 * 1024,
                            memory_bytes=8 * GIB, lr_scaling="sqrt")
    assert (c.batch, c.binding) == (16384, "memory") and "8.0 GiB RAM at 64.0 KiB per row" in c.reason
    assert c.learning_rate == pytest.approx(0.00048 * math.sqrt(16384 / 131072), rel=5e-3)  # 3 significant digits


def test_nvidia_caps_the_batch_and_keeps_its_rate():
    c = cd.choose_cpu_batch(10 ** 12, bytes_per_row=1, memory_bytes=1024 * GIB, **DLRM)
    assert (c.batch, c.learning_rate, c.binding) == (65536, 24.0, "nvidia")


def test_floor_and_a_dataset_smaller_than_a_batch():
    c = cd.choose_cpu_batch(5000, bytes_per_row=1024, memory_bytes=16 * GIB, **DLRM)
    assert (c.batch, c.binding) == (cd.MIN_BATCH, "floor")
    # fewer rows than the floor: one step over the whole set, never a batch that no row fills
    c = cd.choose_cpu_batch(700, bytes_per_row=1024, memory_bytes=16 * GIB, **DLRM)
    assert (c.batch, c.binding) == (700, "dataset") and "whole training set of 700 rows" in c.reason
    # ... split evenly over 4 ranks
    assert cd.choose_cpu_batch(701, bytes_per_row=1024, memory_bytes=16 * GIB, multiple_of=4, **DLRM).batch == 700


def test_unknown_row_count_is_bounded_by_memory_only():
    c = cd.choose_cpu_batch(None, bytes_per_row=200 * 1024, memory_bytes=23 * GIB, **DLRM)
    assert (c.batch, c.binding) == (8192, "memory")


def test_given_rate_is_kept_and_accumulation_counts():
    c = cd.choose_cpu_batch(300_000, bytes_per_row=1024, memory_bytes=16 * GIB, given_learning_rate=0.1, **DLRM)
    assert (c.batch, c.learning_rate) == (2048, 0.1) and c.reason.endswith("; --learning_rate 0.1 as given")
    c = cd.choose_cpu_batch(300_000, bytes_per_row=1024, memory_bytes=16 * GIB, steps_per_batch=2, **DLRM)
    assert c.batch == 1024 and c.learning_rate == pytest.approx(24 * 2048 / 65536)


def test_given_flags_counts_a_flag_equal_to_its_default():
    p = argparse.ArgumentParser()
    p.add_argument("--batch_size", type=int, default=65536)
    p.add_argument("--learning_rate", type=float, default=24.0)
    assert cd.given_flags(p, ["--batch_size", "65536"]) == {"batch_size"}
    assert cd.given_flags(p, []) == set()


def test_schedule_keeps_its_fraction_of_an_epoch():
    # NVIDIA's TF2 DLRM warmup 8000 of its 64014-step run (one Criteo-1TB epoch) -> 1/8 of a 97-step run
    assert cd.scale_schedule_steps(8000, 1024, 65536, 64014, 97) == 12
    assert cd.scale_schedule_steps(8000, 1024, 65536, 64014, None) == 8000 * 64


def test_the_defaults_line_says_what_was_chosen_or_nothing():
    """defaults_line: the one line a recipe prints about its CPU defaults (None when nothing was chosen)."""
    recipe = cd.RecipeBatch(65536, 24.0, "linear", "batch_size", "learning_rate", "valid_batch_size")
    given = frozenset({"learning_rate", "decay_steps"})
    chosen = cd.choose_batch_defaults(given, recipe, bytes_per_row=1024, world_size=2, training=True,
                                      train_rows=300_000, given_learning_rate=2.0, memory_bytes=16 * GIB)
    _, moved = cd.choose_schedule_defaults(given, {"warmup_steps": 8000}, chosen.choice.batch, 65536, 64013, 146)
    line = cd.defaults_line("dlrm.py", [*chosen.parts, moved], "--batch_size")
    assert line.startswith("dlrm.py: CPU defaults: --batch_size 2048") and line.endswith("(and the rest) to choose.")
    # evaluation only, its batch flag given: nothing chosen, nothing said
    assert not cd.training_batch_wanted(set(), recipe, training=False)
    nothing = cd.choose_batch_defaults({"valid_batch_size"}, recipe, bytes_per_row=1024, world_size=1,
                                       training=False, train_rows=None)
    assert (dict(nothing.values), nothing.parts, nothing.choice) == ({}, (), None)
    assert cd.defaults_line("dlrm.py", nothing.parts, "--batch_size") is None


def test_choose_batch_defaults_returns_choices_and_writes_nothing():
    """choose_batch_defaults / choose_schedule_defaults return what they chose; the user's flags stay as given."""
    recipe = cd.RecipeBatch(65536, 24.0, "linear", "batch_size", "learning_rate", "valid_batch_size")
    given = frozenset({"learning_rate", "decay_steps"})
    chosen = cd.choose_batch_defaults(given, recipe, bytes_per_row=1024, world_size=2, training=True,
                                      train_rows=300_000, given_learning_rate=2.0, memory_bytes=16 * GIB)
    assert chosen.values == {"valid_batch_size": 65536, "batch_size": 2048, "learning_rate": 2.0}
    assert chosen.parts[0] == chosen.choice.reason and "--learning_rate 2 as given" in chosen.parts[0]
    moved, line = cd.choose_schedule_defaults(given, {"warmup_steps": 8000, "decay_steps": 24000}, 2048, 65536,
                                              64013, 146)
    assert moved == {"warmup_steps": 18}
    assert line == "--warmup_steps 18 (NVIDIA's schedule over 146 steps as over its 64013)"
    nothing = cd.choose_batch_defaults({"valid_batch_size", "batch_size"}, recipe, bytes_per_row=1024, world_size=1,
                                       training=True, train_rows=None)
    assert (dict(nothing.values), nothing.parts, nothing.choice) == ({}, (), None)
    assert cd.choose_schedule_defaults({"warmup_steps"}, {"warmup_steps": 8000}, 1024, 65536, 64013, 10) == ({}, None)
