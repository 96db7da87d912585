"""Where each embedding table lives in a hybrid-parallel job (pure python: no TensorFlow, no Horovod).

The reference (NVIDIA's TF2 DLRM/DCNv2 through Merlin Distributed Embeddings) places tables *model-parallel*:
each table, or each slice of a large table, lives on one rank, which looks it up for the whole global batch; the
lookups then travel to the ranks that own the batch rows with one all-to-all. Our planner takes the same flags:

* ``column_slice_threshold`` (elements = rows x dim): a larger table is cut into column slices (the smallest power
  of two that brings each slice under the threshold, at most ``world_size`` and ``dim`` slices), each placed like a
  table; a rank's lookup gives some columns of every row and the receiving rank concatenates them.
* ``row_slice_threshold`` (elements): a larger table is cut by rows across all ranks (slice ``r`` on rank ``r``);
  each rank looks up only the ids in its row range (others give zeros) and the receiving rank sums the pieces.
  Checked before column slicing: a table above both is row-sliced.
* ``data_parallel_threshold`` (elements): a smaller table is replicated on every rank (``ShardSpec.rank == -1``) and
  looked up locally for the rank's own batch slice; its gradient is allreduced like the MLPs'.
* ``cpu_offloading_threshold_gb``: when a rank's model-parallel shards exceed this many GiB (float32), its largest
  shards go to host memory (``offload_to_cpu``; ``tf.device('/CPU:0')``) until the rest fits.
* ``strategy``: ``basic`` = round-robin in table order; ``memory_balanced`` = largest piece first onto the rank
  holding the fewest elements so far (never two slices of one table on a rank while another rank has none of it);
  ``memory_optimized`` (an MDE strategy) is not implemented by our planner and is refused with a clear error.

With one rank nothing is sliced: every table is one shard on rank 0 (offloading still applies).

Example::

    >>> p = plan_placement([1000, 10, 500], 8, world_size=2)
    >>> [(s.table, s.rank) for s in p.shards]
    [(0, 0), (1, 1), (2, 1)]
    >>> p.input_tables(1)
    [(1, True), (2, True)]
"""
from __future__ import annotations

import dataclasses
import math
from typing import List, Optional, Sequence, Tuple, Union

from recsys_common.cli import InputError

STRATEGIES = ("memory_balanced", "basic", "memory_optimized")
DATA_PARALLEL = -1
BYTES_PER_ELEMENT = 4  # embeddings are always float32


class PlacementError(InputError):
    """A placement that cannot work (the message names the flag to change)."""


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """One piece of one table: rows ``[rows[0], rows[1])`` and columns ``[cols[0], cols[1])`` of table ``table``.

    ``rank`` owns it (``-1``: data-parallel, a full replica on every rank); ``offload_to_cpu``: kept in host memory.
    """
    table: int
    rank: int
    rows: Tuple[int, int]
    cols: Tuple[int, int]
    offload_to_cpu: bool = False

    @property
    def data_parallel(self) -> bool:
        return self.rank == DATA_PARALLEL

    @property
    def num_rows(self) -> int:
        return self.rows[1] - self.rows[0]

    @property
    def num_cols(self) -> int:
        return self.cols[1] - self.cols[0]

    @property
    def elements(self) -> int:
        return self.num_rows * self.num_cols


def variable_name(shard: ShardSpec, table_rows: int, table_dim: int) -> str:
    """``table_<t>`` for a whole table, ``table_<t>_rows_<a>_<b>_cols_<c>_<d>`` for a slice of one."""
    if shard.rows == (0, table_rows) and shard.cols == (0, table_dim):
        return f"table_{shard.table}"
    return f"table_{shard.table}_rows_{shard.rows[0]}_{shard.rows[1]}_cols_{shard.cols[0]}_{shard.cols[1]}"


@dataclasses.dataclass(frozen=True)
class Placement:
    """The plan of :func:`plan_placement`: every shard of every table (sorted by table, rows, columns)."""
    table_sizes: Tuple[int, ...]
    embedding_dims: Tuple[int, ...]
    world_size: int
    strategy: str
    shards: Tuple[ShardSpec, ...]

    @property
    def num_tables(self) -> int:
        return len(self.table_sizes)

    def shards_of_table(self, table: int) -> List[ShardSpec]:
        return [s for s in self.shards if s.table == table]

    def is_data_parallel(self, table: int) -> bool:
        return any(s.data_parallel for s in self.shards_of_table(table))

    @property
    def data_parallel_tables(self) -> List[int]:
        return [t for t in range(self.num_tables) if self.is_data_parallel(t)]

    @property
    def model_parallel_tables(self) -> List[int]:
        return [t for t in range(self.num_tables) if not self.is_data_parallel(t)]

    def local_shards(self, rank: int) -> List[ShardSpec]:
        """Shards whose variable lives on ``rank``: its model-parallel shards and every data-parallel replica."""
        self._check_rank(rank)
        return [s for s in self.shards if s.rank == rank or s.data_parallel]

    def model_parallel_shards(self, rank: int) -> List[ShardSpec]:
        """``rank``'s model-parallel shards in the order their columns travel in the all-to-all."""
        self._check_rank(rank)
        return [s for s in self.shards if s.rank == rank]

    def input_tables(self, rank: int) -> List[Tuple[int, bool]]:
        """Tables whose ids ``rank`` reads, in table order, as ``(table, is_global_batch)``.

        ``is_global_batch`` is True for a model-parallel table (the rank looks it up for the whole global batch) and
        False for a data-parallel one (only the rank's own slice of the batch). This is the order of the
        ``categorical`` tuple the data loader hands to the model.
        """
        tables = sorted({s.table for s in self.local_shards(rank)})
        return [(t, not self.is_data_parallel(t)) for t in tables]

    def rank_width(self, rank: int) -> int:
        """Columns ``rank`` sends per batch row in the all-to-all (sum of its model-parallel shards' columns)."""
        return sum(s.num_cols for s in self.model_parallel_shards(rank))

    def rank_elements(self, rank: int) -> int:
        """Elements of ``rank``'s model-parallel shards (its share of the model, excluding replicas)."""
        return sum(s.elements for s in self.model_parallel_shards(rank))

    def describe(self) -> str:
        """One line per rank, for the log: which pieces it owns and how many elements."""
        lines = [f"placement ({self.strategy}, {self.world_size} rank(s), {self.num_tables} tables)"]
        dp = self.data_parallel_tables
        if dp:
            lines.append(f"  data-parallel (replicated) tables: {dp}")
        for rank in range(self.world_size):
            pieces = []
            for s in self.model_parallel_shards(rank):
                whole = s.rows == (0, self.table_sizes[s.table]) and s.cols == (0, self.embedding_dims[s.table])
                piece = f"{s.table}" if whole else f"{s.table}[rows {s.rows[0]}:{s.rows[1]}, cols {s.cols[0]}:{s.cols[1]}]"
                pieces.append(piece + (" (cpu)" if s.offload_to_cpu else ""))
            lines.append(f"  rank {rank}: {self.rank_elements(rank)} elements: tables {', '.join(pieces)}")
        return "\n".join(lines)

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside [0, {self.world_size})")


def _even_bounds(total: int, parts: int) -> List[Tuple[int, int]]:
    """``parts`` contiguous ranges covering ``[0, total)``, sizes differing by at most one (larger ones first)."""
    base, extra = divmod(total, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _check_threshold(value, flag: str) -> Optional[float]:
    if value is None:
        return None
    value = float(value)
    if not value > 0 or math.isnan(value):
        raise PlacementError(f"{flag} must be a positive number, got {value}")
    return value


def plan_placement(table_sizes: Sequence[int], embedding_dims: Union[int, Sequence[int]], world_size: int,
                   strategy: str = "memory_balanced", column_slice_threshold: Optional[float] = None,
                   row_slice_threshold: Optional[float] = None, data_parallel_threshold: Optional[float] = None,
                   cpu_offloading_threshold_gb: Optional[float] = None) -> Placement:
    """Plan which rank holds which piece of which table (see the module docstring for every rule).

    ``table_sizes``: rows per table; ``embedding_dims``: one dim for all tables or one per table; thresholds in
    elements (rows x dim; ``None`` = never), the offload threshold in GiB of float32 per rank. Raises
    :class:`PlacementError` for a plan that cannot work, naming the flag to change.
    """
    table_sizes = tuple(int(n) for n in table_sizes)
    if isinstance(embedding_dims, int):
        embedding_dims = (embedding_dims,) * len(table_sizes)
    embedding_dims = tuple(int(d) for d in embedding_dims)
    _check_plan(table_sizes, embedding_dims, world_size, strategy)
    column_slice_threshold = _check_threshold(column_slice_threshold, "--column_slice_threshold")
    row_slice_threshold = _check_threshold(row_slice_threshold, "--row_slice_threshold")
    data_parallel_threshold = _check_threshold(data_parallel_threshold, "--data_parallel_threshold")
    offload_gb = _check_threshold(cpu_offloading_threshold_gb, "--cpu_offloading_threshold_gb")
    fixed, units = _pieces(table_sizes, embedding_dims, world_size, column_slice_threshold, row_slice_threshold,
                           data_parallel_threshold)
    shards = fixed + _assign(units, fixed, world_size, strategy)
    _check_every_rank_owns_a_table(shards, world_size)
    if offload_gb is not None:
        shards = _offload(shards, world_size, offload_gb * 2 ** 30)
    shards.sort(key=lambda s: (s.table, s.rows, s.cols))
    return Placement(table_sizes, embedding_dims, world_size, strategy, tuple(shards))


def _check_plan(table_sizes: Tuple[int, ...], embedding_dims: Tuple[int, ...], world_size: int, strategy: str) -> None:
    if not table_sizes:
        raise PlacementError("no embedding tables: the feature spec has no categorical features")
    if len(embedding_dims) != len(table_sizes):
        raise PlacementError(f"--embedding_dim gives {len(embedding_dims)} dims for {len(table_sizes)} tables")
    for t, (rows, dim) in enumerate(zip(table_sizes, embedding_dims)):
        if rows < 1 or dim < 1:
            raise PlacementError(f"table {t} has {rows} rows and dim {dim}: both must be at least 1")
    if world_size < 1:
        raise PlacementError(f"world size must be at least 1, got {world_size}")
    if strategy not in STRATEGIES:
        raise PlacementError(f"--dist_strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if strategy == "memory_optimized":
        raise PlacementError("--dist_strategy memory_optimized is Merlin Distributed Embeddings' strategy and is not "
                             "implemented by this recipe's placement: use memory_balanced or basic, or "
                             "--use_mde_embeddings where distributed_embeddings is installed (NGC image)")


def _pieces(table_sizes: Tuple[int, ...], embedding_dims: Tuple[int, ...], world_size: int,
            column_slice_threshold: Optional[float], row_slice_threshold: Optional[float],
            data_parallel_threshold: Optional[float]) -> Tuple[List[ShardSpec], List[ShardSpec]]:
    """``(fixed, units)``: data-parallel replicas and row slices (their rank is decided by the rule), and the pieces
    the strategy places (whole tables and column slices; rank filled in by :func:`_assign`)."""
    fixed: List[ShardSpec] = []
    units: List[ShardSpec] = []
    for t, (rows, dim) in enumerate(zip(table_sizes, embedding_dims)):
        elements = rows * dim
        if data_parallel_threshold is not None and elements < data_parallel_threshold:
            fixed.append(ShardSpec(t, DATA_PARALLEL, (0, rows), (0, dim)))
        elif world_size > 1 and row_slice_threshold is not None and elements > row_slice_threshold:
            for r, row_range in enumerate(_even_bounds(rows, min(world_size, rows))):
                fixed.append(ShardSpec(t, r, row_range, (0, dim)))
        elif world_size > 1 and column_slice_threshold is not None and elements > column_slice_threshold:
            slices = 1
            while elements / slices > column_slice_threshold and slices * 2 <= min(world_size, dim):
                slices *= 2
            for col_range in _even_bounds(dim, slices):
                units.append(ShardSpec(t, DATA_PARALLEL, (0, rows), col_range))
        else:
            units.append(ShardSpec(t, DATA_PARALLEL, (0, rows), (0, dim)))
    return fixed, units


def _assign(units: List[ShardSpec], fixed: List[ShardSpec], world_size: int, strategy: str) -> List[ShardSpec]:
    """``units`` with their ranks: round robin (``basic``) or, ``memory_balanced``, largest first onto the
    least-loaded rank not holding a piece of the same table (ties: lowest rank), ``fixed``'s row slices counted."""
    if strategy == "basic":
        return [dataclasses.replace(s, rank=i % world_size) for i, s in enumerate(units)]
    load = [0] * world_size
    tables_on: List[set] = [set() for _ in range(world_size)]
    for s in fixed:
        if not s.data_parallel:
            load[s.rank] += s.elements
            tables_on[s.rank].add(s.table)
    placed: List[ShardSpec] = []
    for s in sorted(units, key=lambda s: (-s.elements, s.table, s.cols)):
        free = [r for r in range(world_size) if s.table not in tables_on[r]] or list(range(world_size))
        rank = min(free, key=lambda r: (load[r], r))
        load[rank] += s.elements
        tables_on[rank].add(s.table)
        placed.append(dataclasses.replace(s, rank=rank))
    return placed


def _check_every_rank_owns_a_table(shards: List[ShardSpec], world_size: int) -> None:
    model_parallel = [s for s in shards if not s.data_parallel]
    if not model_parallel:
        return
    idle = sorted(set(range(world_size)) - {s.rank for s in model_parallel})
    if idle:
        n_tables = len({s.table for s in model_parallel})
        raise PlacementError(
            f"{world_size} ranks but only {len(model_parallel)} model-parallel embedding piece(s) "
            f"({n_tables} table(s) placed table-wise): rank(s) {idle} would own no table. Run at most "
            f"{len(model_parallel)} ranks, or lower --column_slice_threshold / --row_slice_threshold so that "
            f"large tables are sliced across ranks")


def _offload(shards: List[ShardSpec], world_size: int, limit_bytes: float) -> List[ShardSpec]:
    """``--cpu_offloading_threshold_gb``: each rank's largest model-parallel pieces marked for host memory until
    the rest fits in ``limit_bytes``."""
    model_parallel = [s for s in shards if not s.data_parallel]
    offloaded = set()
    for rank in range(world_size):
        mine = sorted((s for s in model_parallel if s.rank == rank), key=lambda s: (-s.elements, s.table, s.cols))
        resident = sum(s.elements for s in mine) * BYTES_PER_ELEMENT
        for s in mine:
            if resident <= limit_bytes:
                break
            offloaded.add(s)
            resident -= s.elements * BYTES_PER_ELEMENT
    return [dataclasses.replace(s, offload_to_cpu=True) if s in offloaded else s for s in shards]
