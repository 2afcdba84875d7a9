"""Process groups for the mesh axis sets a program uses, created on demand and cached
(docs/running.md, "Notes"). One process group serves every ordering of an axis set: a
:class:`GroupHandle` says which mesh rank sits at which process-group rank (torch sorts
them), and the executor places every piece by its box.

A :class:`MeshContext` (``context()``) covers every rank under **LocalTensorMode** (a
group is rank 0's, from which LocalTensorMode infers the others); on a **default process
group** mesh rank = global rank, the world as big as the mesh; a **named DeviceMesh** maps
mesh ranks to global ones (``device_mesh.mesh``: part of a bigger world), and its
single-axis groups are its own.

New groups are made with ``use_local_synchronization=True``: only the members call
``new_group``, so groups can be created lazily by the ranks that need them. torch names
such a group after its ranks *and how many groups the caller already has*, so every rank
must make as many groups as every other: a mesh over the whole world does (each rank makes
its own group of each axis set, in the same order). A mesh over some of the world's ranks
gets its groups from ``subset_context`` instead, which every rank of the world calls: each
makes one group per new partition of the world (its own part, a part of one rank for the
ranks off the mesh), kept apart from the world mesh's groups, so a cache hit on some ranks
can never be a new group on others.
"""

from __future__ import annotations

import atexit
import gc
import sys
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from lowering.caching import anchored_get, anchored_put
from lowering.checks import check_timeout_s
from lowering.layout import group_ranks
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh
from spec_lang.parser import parse_mesh
from torch_backend.faults import CollectiveError, collective_failure, group_timeout


def local_tensor_mode() -> Any | None:
    """The enabled LocalTensorMode, or None (also None where torch lacks it).

    A mode can be enabled only once its module was imported: until then a real rank's
    call does not pay for that import."""
    lookup = getattr(sys.modules.get("torch.distributed._local_tensor"), "enabled_local_tensor_mode", None)
    return None if lookup is None else lookup()


@dataclass(frozen=True)
class GroupHandle:
    """A process group and its members as mesh ranks, in process-group rank order."""

    pg: Any
    members: tuple[int, ...]


# The caches belong to one default group (``world``), so that a destroyed-and-recreated
# world (tests do this) starts empty:
#   groups: (sorted global ranks, timeout, device) -> process group
#   partitions: (partition of the world's ranks, timeout, device) -> this rank's part's group
#   contexts: Mesh -> {timeout: MeshContext}, for meshes given as a string or a Mesh
#   dm_contexts: DeviceMesh (held weakly, as everywhere: a new one at a dead one's address
#     never hits) -> {timeout: MeshContext}
#   local: (id(LocalTensorMode), Mesh, id(DeviceMesh), timeout) -> (mode, MeshContext), least
#     recently used evicted first: so a cache keyed by a context hits under LocalTensorMode
_FRESH: dict[str, Callable[[], Any]] = {"groups": dict, "partitions": dict, "contexts": dict,
                                        "dm_contexts": weakref.WeakKeyDictionary, "local": OrderedDict}
_CACHE: dict[str, Any] = {"world": None} | {name: new() for name, new in _FRESH.items()}
_LOCAL_MAX = 64
# DeviceMesh (weakly) -> (Mesh, mesh rank -> global rank). Reading ``DeviceMesh.mesh``
# rebuilds a tensor from the mesh layout each time, so it is read once per DeviceMesh.
_DEVICE_MESHES: weakref.WeakKeyDictionary[Any, tuple[Mesh, tuple[int, ...]]] = weakref.WeakKeyDictionary()


def _bind_caches() -> None:
    """Bind the caches to the current default group (a new world starts them empty)."""
    world = dist.distributed_c10d._get_default_group()
    if _CACHE["world"] is not world:
        _CACHE.update(world=world, **{name: new() for name, new in _FRESH.items()})


def clear_caches() -> None:
    """Empty every cache of ``lowering`` and this module's contexts and resolved DeviceMeshes,
    but not its process groups (docs/architecture.md, "Caches", says why)."""
    from lowering.caching import clear_caches as clear_lowering

    clear_lowering()
    _CACHE.update(contexts={}, dm_contexts=weakref.WeakKeyDictionary(), local=OrderedDict())
    _DEVICE_MESHES.clear()


def _release_groups() -> None:
    """Drop every process group and context this module (and the caches built on it) holds.

    Run at interpreter exit: a gloo group that outlives ``destroy_process_group`` in these
    caches would otherwise be torn down with the interpreter, where it can abort the
    process ("terminate called without an active exception") after a clean run, which
    torchrun reports as a failed rank."""
    clear_caches()
    _CACHE.update(world=None, groups={}, partitions={})
    gc.collect()


atexit.register(_release_groups)


@dataclass
class MeshContext:
    """Where a program runs: the mesh, which mesh ranks this process plays, and groups."""

    mesh: Mesh
    ranks: tuple[int, ...]  # mesh ranks this process executes (all of them under LocalTensorMode)
    to_global: tuple[int, ...]  # mesh rank -> global rank
    local_mode: Any | None = None  # the LocalTensorMode, if simulating
    dm_ref: Callable[[], Any] | None = field(default=None, repr=False)  # weakref to the DeviceMesh
    timeout: timedelta | None = None
    backend: str = "gloo"
    _members: dict[tuple[str, ...], GroupHandle] = field(default_factory=dict, repr=False)

    @property
    def device_mesh(self) -> Any | None:
        """The DeviceMesh this context was made for (None for a mesh string, or once it died)."""
        return self.dm_ref() if self.dm_ref is not None else None

    @property
    def rank(self) -> int:
        """This process's mesh rank (real process groups only)."""
        return self.ranks[0]

    def group(self, axes: tuple[str, ...], rank: int) -> GroupHandle:
        """The process group of ``rank``'s group over ``axes`` (created on first use)."""
        key = tuple(sorted(axes, key=self.mesh.index))
        handle = self._members.get(key)
        if handle is None:
            handle = self._members[key] = self._new_handle(key)
        if self.local_mode is not None:
            # one process group (rank 0's) stands for all; members follow LocalTensorMode,
            # which runs each fiber in ascending rank order
            return GroupHandle(handle.pg, tuple(sorted(group_ranks(self.mesh, key, rank))))
        return handle

    def _new_handle(self, axes: tuple[str, ...]) -> GroupHandle:
        mine = group_ranks(self.mesh, axes, 0 if self.local_mode is not None else self.rank)
        if self.local_mode is not None:
            return GroupHandle(_new_group(tuple(sorted(self.to_global[q] for q in mine)), None, None), ())
        dm = self.device_mesh
        pg = dm.get_group(axes[0]) if dm is not None and len(axes) == 1 else None
        if pg is None:
            try:
                pg = _new_group(tuple(sorted(self.to_global[q] for q in mine)), self.timeout, nccl_device(self.backend))
            except RuntimeError as e:  # a member died or never came: c10d's errors name nobody
                raise self.real_failure(f"rank {self.rank}: creating the process group over {','.join(axes)} "
                                        f"(ranks {sorted(mine)})", e, sorted(mine)) from e
        order = _members(pg, self.to_global)
        if sorted(order) != sorted(mine):
            raise RuntimeError(f"process group for {axes} holds ranks {order}, expected {sorted(mine)}")
        return GroupHandle(pg, order)

    def global_rank(self, mesh_rank: int) -> int:
        return self.to_global[mesh_rank]

    def real_failure(self, where: str, e: BaseException, members: Sequence[int],
                     axes: tuple[str, ...] | None = None) -> CollectiveError:
        """The CollectiveError of a collective (or a group's creation) on real process groups
        that failed ``where``, over the mesh ranks ``members`` (the group over ``axes``, made
        already; None: not made), naming who is at fault where the store can tell
        (``torch_backend.faults``; ``comm.failed`` picks this for c10d)."""
        timeout = self.timeout
        if timeout is None:
            made = self._members.get(tuple(sorted(axes, key=self.mesh.index))) if axes is not None else None
            timeout = group_timeout(made.pg if made is not None else dist.group.WORLD)
        to_mesh = {g: q for q, g in enumerate(self.to_global)}
        return collective_failure(where, e, [self.to_global[q] for q in members], self.to_global[self.rank],
                                  timeout, to_mesh)


def nccl_device(backend: str) -> torch.device | None:
    """Where NCCL makes a group's communicator eagerly (every member at once, so a later
    batch_isend_irecv in which some members have nothing to do cannot hang); None else."""
    return torch.device("cuda", torch.cuda.current_device()) \
        if backend == "nccl" and torch.cuda.is_available() else None


def _members(pg: Any, to_global: tuple[int, ...]) -> tuple[int, ...]:
    """The mesh ranks of a process group's members, in process-group rank order."""
    from_global = {g: q for q, g in enumerate(to_global)}
    return tuple(from_global[g] for g in dist.get_process_group_ranks(pg))


def _new_group(ranks: tuple[int, ...], timeout: timedelta | None, device: Any) -> Any:
    """The process group over global ``ranks``: the whole world is the default group itself,
    whose own timeout applies (a context's timeout still bounds each wait, ``comm``)."""
    if ranks == tuple(range(dist.get_world_size())):
        return dist.group.WORLD
    return _made_group("groups", ranks, ranks, timeout, device)


def _made_group(cache: str, key: Any, ranks: Sequence[int], timeout: timedelta | None, device: Any) -> Any:
    """The group over global ``ranks`` made by its members alone (``use_local_synchronization``),
    once per (``key``, timeout, device) in ``_CACHE[cache]``."""
    _bind_caches()
    full = (key, timeout, None if device is None else str(device))
    pg = _CACHE[cache].get(full)
    if pg is None:
        kwargs = {"timeout": timeout, "device_id": device}
        pg = _CACHE[cache][full] = dist.new_group(list(ranks), use_local_synchronization=True,
                                                  **{k: v for k, v in kwargs.items() if v is not None})
    return pg


def subset_context(mesh: Mesh, to_global: tuple[int, ...], axes_sets: Sequence[tuple[str, ...]], *,
                   timeout: timedelta | None, backend: str) -> MeshContext | None:
    """The context of ``mesh`` laid over the global ranks ``to_global`` (some of the
    world's), with its groups over ``axes_sets`` made now; None on ranks off the mesh.

    Every rank of the world calls it with the same arguments, in the same order (a
    cross-mesh call, which every rank takes part in): see the module docstring."""
    me = dist.get_rank()
    ctx = MeshContext(mesh, (to_global.index(me),), to_global, timeout=timeout, backend=backend) \
        if me in to_global else None
    device = nccl_device(backend)
    on_mesh = set(to_global)
    for axes in axes_sets:
        key = tuple(sorted(axes, key=mesh.index))
        if mesh.group_size(key) <= 1:
            continue
        parts = {tuple(sorted(to_global[q] for q in group_ranks(mesh, key, r))) for r in range(mesh.size)}
        parts |= {(r,) for r in range(dist.get_world_size()) if r not in on_mesh}
        pg = _partition_group(tuple(sorted(parts)), me, timeout, device)
        if ctx is not None and key not in ctx._members:
            ctx._members[key] = GroupHandle(pg, _members(pg, to_global))
    return ctx


def _partition_group(parts: tuple[tuple[int, ...], ...], me: int, timeout: timedelta | None, device: Any) -> Any:
    """This rank's part's group of a partition of the world, made by every rank alike."""
    mine = next(part for part in parts if me in part)
    if len(parts) == 1:
        return dist.group.WORLD
    try:
        return _made_group("partitions", parts, mine, timeout, device)
    except RuntimeError as e:  # a member died or never came: c10d's errors name nobody
        raise collective_failure(f"rank {me}: creating the process group over ranks {list(mine)}", e,
                                 mine, me, timeout) from e


def _read_device_mesh(dm: Any) -> tuple[Mesh, tuple[int, ...]]:
    names = getattr(dm, "mesh_dim_names", None)
    if not names:
        raise SpecError("the DeviceMesh has no mesh_dim_names",
                        hint="create it with init_device_mesh(..., mesh_dim_names=('dp', 'tp'))")
    from torch.utils._python_dispatch import _disable_current_modes

    # a DeviceMesh first seen inside torch.compile's trace: its rank tensor is built on every
    # read, and under the trace's fake mode it would be fake (its values unknown)
    with _disable_current_modes():
        layout = dm.mesh  # a tensor rebuilt on every read: read it once
        ranks = tuple(int(g) for g in layout.flatten().tolist())
    return Mesh(tuple(names), tuple(int(s) for s in layout.shape)), ranks


def _resolve_device_mesh(dm: Any) -> tuple[Mesh, tuple[int, ...]]:
    """(Mesh, mesh rank -> global rank) of a DeviceMesh, read once per DeviceMesh."""
    try:
        got = _DEVICE_MESHES.get(dm)
    except TypeError:  # not weakly referenceable (a stand-in object): read it every time
        return _read_device_mesh(dm)
    if got is None:
        got = _DEVICE_MESHES[dm] = _read_device_mesh(dm)
    return got


def device_mesh_over_ranks(dm: Any) -> Mesh:
    """A named DeviceMesh as a ``Mesh`` that names its global ranks (``dp=2@[4-5]``), read
    once per DeviceMesh."""
    m, ranks = _resolve_device_mesh(dm)
    return Mesh(m.names, m.sizes, ranks)


def is_device_mesh(obj: Any) -> bool:
    # a DeviceMesh by isinstance, the test dynamo's trace answers (there ``type(dm)`` is not
    # DeviceMesh, so the duck test below fails); no DeviceMesh exists before its module loads
    cls = getattr(sys.modules.get("torch.distributed.device_mesh"), "DeviceMesh", None)
    if cls is not None and isinstance(obj, cls):
        return True
    # a stand-in: look on the type first, since reading DeviceMesh.mesh on the instance builds a tensor
    return hasattr(type(obj), "get_group") and (hasattr(type(obj), "mesh") or hasattr(obj, "mesh"))


def _weak(dm: Any) -> Callable[[], Any] | None:
    if dm is None:
        return None
    try:
        return weakref.ref(dm)
    except TypeError:  # not weakly referenceable: hold it (only stand-in objects)
        return lambda: dm


def check_timeout(timeout: object) -> timedelta | None:
    """A collective timeout as a timedelta (None: the process group's own); a SpecError,
    before any communication, for anything but a positive number of seconds or timedelta
    (``lowering.checks.check_timeout_s``)."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    return timedelta(seconds=check_timeout_s(
        seconds, "timeout",
        "pass seconds (e.g. 60) or a datetime.timedelta, or None for the process group's own timeout"))


def context(mesh: Mesh | str | Any, *, timeout: timedelta | float | None = None,
            over_ranks: bool = False) -> MeshContext:
    """The MeshContext for ``mesh`` (str, Mesh or DeviceMesh) in the current process.

    Raises SpecError (before any communication) when there is no process group, or the
    world does not match the mesh. Cached on real process groups (``_contexts``).

    ``over_ranks``: a string or Mesh may lie over some of the world's ranks, as a DeviceMesh
    may (``fsdp=2@[2,3]``; without ``@``, the first ``size`` ranks), for a call that makes no
    process group (``distribute``); a rank off it is refused as off a DeviceMesh. Such a
    context is not cached (its ranks are not those a call without ``over_ranks`` reads).
    """
    timeout = check_timeout(timeout)
    dm = None
    if isinstance(mesh, (str, Mesh)):
        m = parse_mesh(mesh)
        to_global = None
    elif is_device_mesh(mesh):
        dm = mesh
        m, to_global = _resolve_device_mesh(mesh)
    else:
        raise SpecError(f"expected a mesh, got {type(mesh).__name__}",
                        hint="pass a mesh string like 'dp=2,tp=4', a spec_lang Mesh, or a named DeviceMesh")
    lm = local_tensor_mode()
    subset = over_ranks and dm is None and lm is None
    cached = _contexts(m, dm) if lm is None and dist.is_initialized() and not subset else None
    if cached is not None and timeout in cached:
        return cached[timeout]
    if to_global is None:
        to_global = m.global_ranks if subset else tuple(range(m.size))
    if lm is not None:
        return _local_context(lm, m, dm, to_global, timeout)
    if not dist.is_initialized():
        raise SpecError(
            "no torch.distributed process group is initialized",
            hint="call torch.distributed.init_process_group(...), run under torchrun, "
            "use `shardc run`, or enter LocalTensorMode to simulate the ranks",
        )
    world = dist.get_world_size()
    me = dist.get_rank()
    shown = mesh if isinstance(mesh, str) else str(m)  # as written: fsdp=2@[0,1] keeps its ranks
    if dm is None and world != m.size and not subset:
        hint = f"launch {m.size} ranks, or pass a DeviceMesh covering the ranks to use"
        if m.ranks is not None or "@" in shown:
            hint = ("this call runs on a mesh of the whole world; a mesh over some of its ranks takes a "
                    "DeviceMesh, or redistribute(..., dst_mesh=) for a move between meshes")
        raise SpecError(f"the world has {world} ranks but the mesh {shown} has {m.size}", hint=hint)
    if subset and max(to_global) >= world:
        raise SpecError(f"the mesh {shown} names global rank {max(to_global)}, but the world has {world} ranks",
                        hint=f"name ranks 0 to {world - 1}")
    if me not in to_global:
        if subset:
            raise SpecError(f"global rank {me} is not on the mesh {shown} (global ranks {list(to_global)})",
                            hint="call it only on the ranks of the mesh, as with a DeviceMesh over them")
        raise SpecError(f"global rank {me} is not on the DeviceMesh {to_global}",
                        hint="call it only on the ranks of the DeviceMesh")
    backend = str(dist.get_backend())
    ctx = MeshContext(m, (to_global.index(me),), to_global, dm_ref=_weak(dm), timeout=timeout, backend=backend)
    if cached is not None:
        cached[timeout] = ctx
    return ctx


def _local_context(lm: Any, m: Mesh, dm: Any, to_global: tuple[int, ...], timeout: timedelta | None) -> MeshContext:
    """The context of ``m`` under the LocalTensorMode ``lm`` (cached: ``_CACHE["local"]``)."""
    key = (id(lm), m, id(dm), timeout)
    if dist.is_initialized():
        _bind_caches()
        hit = anchored_get(_CACHE["local"], key, lm)
        if hit is not None and hit.device_mesh is dm:  # held weakly: a dead one's id may be reused
            return hit
    ranks = tuple(sorted(lm.ranks))
    if len(ranks) != m.size or to_global != tuple(ranks):
        raise SpecError(
            f"LocalTensorMode simulates {len(ranks)} ranks but the mesh {m} has {m.size}",
            hint=f"enter LocalTensorMode({m.size}) with a fake process group of world size {m.size}",
        )
    if not dist.is_initialized():
        raise SpecError("LocalTensorMode needs a default process group",
                        hint=f"dist.init_process_group('fake', store=FakeStore(), rank=0, world_size={m.size})")
    ctx = MeshContext(m, ranks, to_global, local_mode=lm, dm_ref=_weak(dm), timeout=timeout, backend="local")
    anchored_put(_CACHE["local"], key, lm, ctx, _LOCAL_MAX)
    return ctx


def real_world() -> Any | None:
    """The default process group where calls run on it (initialized, not under
    LocalTensorMode), else None. A cache of what ``context()`` led to may keep its entries
    while this stays the same object (a new world gets new contexts)."""
    world = dist.GroupMember.WORLD  # None before init_process_group and after destroy
    if world is None or local_tensor_mode() is not None:
        return None
    return world


def _contexts(m: Mesh, dm: Any) -> dict[timedelta | None, MeshContext] | None:
    """The contexts of ``m``, or of the DeviceMesh ``dm``, by timeout (None: ``dm`` is not
    weakly referenceable, and never cached)."""
    _bind_caches()
    try:
        return _CACHE["contexts"].setdefault(m, {}) if dm is None else _CACHE["dm_contexts"].setdefault(dm, {})
    except TypeError:
        return None
