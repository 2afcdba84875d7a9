"""Strings to IR: types, meshes, shard_order dicts, local types and calls (placements), with caret errors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from spec_lang.errors import SpecError, locate, value_text
from spec_lang.ir import DTYPES, Dim, Mesh, TensorType, byte_overflow, bytes_error
from spec_lang.local_type import LocalType
from spec_lang.split import Split

_TYPE_HINT = "write a type like f32[8@(dp,tp),16] or float32[8@dp,16]{U:tp}"
_MESH_HINT = "write a mesh like dp=2,tp=4 (axis=size, in mesh order), over global ranks dp=2,tp=2@[8-11]"
_ORDER_HINT = "write a shard_order like {0: [1], 1: ['dp', 'tp']}"
_LOCAL_HINT = "write R, I, V, P (or U), P(avg), P(max), P(min) or S(dim); in Python spmd.R, spmd.P('avg'), spmd.S(1)"


@lru_cache(maxsize=1)
def _lark() -> Any:
    """The parser of ``grammar.lark``. Building its tables costs a fresh process about 0.1 s
    of its first parse (and often a pass of the collector over torch's objects), so the
    built parser is kept in the user's cache directory and loaded from there (5 ms), under
    a name that hashes the grammar and the lark and Python versions."""
    import hashlib
    import os
    import sys

    import lark

    text = (Path(__file__).with_name("grammar.lark")).read_text()
    key = hashlib.sha256(f"{text}\0{lark.__version__}\0{sys.version}".encode()).hexdigest()[:24]
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = Path(home) / "shardc" / f"grammar-{key}.lark"
    try:
        with path.open("rb") as f:
            return lark.Lark.load(f)
    except Exception:  # absent, unreadable or not a parser: build it
        pass
    parser = lark.Lark(
        text,
        start=["type_start", "mesh_start", "order_start", "call_start", "calls_start"],
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=False,
    )
    try:  # written whole, then renamed: a process that reads it at once finds all of it or none
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        with part.open("wb") as f:
            parser.save(f)
        os.replace(part, path)
    except OSError:  # a read-only home: build it every time
        pass
    return parser


def _describe_expected(expected: set[str], start: str) -> str:
    names = {
        "RSQB": "']'", "LSQB": "'['", "COMMA": "','", "RPAR": "')'", "LPAR": "'('",
        "RBRACE": "'}'", "LBRACE": "'{'", "COLON": "':'", "AT": "'@'", "EQUAL": "'='",
        "INT": "a number", "NAME": "a name" if start.startswith("call") else "an axis name",
        "KIND": "a local type (U, R, I, V, P(op))",
        "DTYPE": "a dtype", "AXIS_CONT": "',axis'", "STRING": "a quoted name",
        "LESSTHAN": "'<'", "MORETHAN": "'>'", "VBAR": "'|'", "RAGGED": "'ragged'", "OVER": "'over'",
        "PARTS": "'parts' or 'aligned'", "MINUS": "'-'",
        "$END": "the end",
    }
    parts = sorted({names.get(e, e) for e in expected})
    return ", ".join(parts)


def _run(text: str, start: str, hint: str, what: str) -> Any:
    from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

    try:
        return _lark().parse(text, start=start)
    except UnexpectedEOF as e:
        raise SpecError(
            f"malformed {what}: it ends too early (expected {_describe_expected(set(e.expected), start)})",
            text=text, pos=len(text), hint=hint,
        ) from None
    except UnexpectedToken as e:
        tok = e.token
        pos = len(text) if tok.type == "$END" else tok.start_pos
        got = "it ends too early" if tok.type == "$END" else f"unexpected {str(tok)!r}"
        raise SpecError(
            f"malformed {what}: {got} (expected {_describe_expected(set(e.expected), start)})",
            text=text, pos=pos, hint=hint,
        ) from None
    except UnexpectedCharacters as e:
        raise SpecError(
            f"malformed {what}: unexpected character {e.char!r}",
            text=text, pos=e.pos_in_stream, hint=hint,
        ) from None
    except UnexpectedInput as e:  # any other lark input error
        raise SpecError(f"malformed {what}", text=text, pos=getattr(e, "pos_in_stream", None), hint=hint) from None
    except RecursionError:
        raise SpecError(f"malformed {what}: too deeply nested", text=text, hint=hint) from None


def _names(tree: Any) -> list[Any]:
    """The NAME tokens of an axis list or group, AXIS_CONT stripped of its comma."""
    out = []
    for tok in tree.children:
        if tok.type == "AXIS_CONT":
            name = tok.value[1:].strip()
            out.append((name, tok.start_pos + len(tok.value) - len(name)))
        else:
            out.append((tok.value, tok.start_pos))
    return out


def read_int(written: str, text: str, pos: int, what: str) -> int:
    """The digits ``written`` at ``pos`` of ``text`` as an int; past 19 digits it cannot fit
    int64, so say so (a caret on the number) before Python's int-string limit (4,300
    digits) turns it into a ValueError."""
    digits = written.lstrip("0") or "0"
    if len(digits) > 19:
        shown = written if len(written) <= 24 else written[:12] + "..."
        raise SpecError(
            f"{what} {shown} ({len(written)} digits) is too large", text=text, pos=pos,
            hint="numbers must stay below 2**63",
        )
    return int(digits)


def _int(tok: Any, text: str, what: str) -> int:
    return read_int(tok.value, text, tok.start_pos, what)


def _caret(e: SpecError, words: list[tuple[str, int]], text: str, fallback: int | None) -> int | None:
    """Where an IR error points in ``text``: its subject's written position (the second
    one for a repeated name), else the fallback."""
    if e.subject is None:
        return fallback
    at = [pos for word, pos in words if word == e.subject]
    if at:
        return at[1] if len(at) > 1 else at[0]
    found = locate(text, e.subject)
    return fallback if found is None else found


def parse(text: str | TensorType) -> TensorType:
    """Parse a type string (``f32[8@(dp,tp),16]{U:tp}``) into a ``TensorType``.

    A ``TensorType`` passes through unchanged.
    """
    if isinstance(text, TensorType):
        return text
    if not isinstance(text, str):
        raise SpecError(f"expected a type string, got {type(text).__name__}", hint=_TYPE_HINT)
    return _parse_type(text)[0]


def invariant_axes(text: str) -> tuple[str, ...]:
    """The mesh axes a type string annotates I explicitly (``{I:dp}``), in the order written.

    The ``TensorType`` drops them (an unannotated axis is I already); the SPMD API keeps
    them, since there a type string states only the axes it names."""
    if not isinstance(text, str):
        raise SpecError(f"expected a type string, got {type(text).__name__}", hint=_TYPE_HINT)
    return _parse_type(text)[1]


@lru_cache(maxsize=4096)
def _parse_type(text: str) -> tuple[TensorType, tuple[str, ...]]:
    """The grammar gives the structure; the IR constructors judge it (one set of rules
    for parsed and built types), and their errors get a caret here. Returns the type and
    the axes annotated I explicitly."""
    tree = _run(text, "type_start", _TYPE_HINT, "type").children[0]
    dtype_tok, *rest = tree.children
    try:
        dtype = TensorType(dtype_tok.value, ()).dtype  # the dtype first, with its own caret
    except SpecError as e:
        raise e.at(text, dtype_tok.start_pos) from None
    words: list[tuple[str, int]] = []  # axis names and sizes where written, for carets
    size_at: list[int] = []  # where each dim's size is written
    dims: list[Dim] = []
    axis_types: list[tuple[str, LocalType]] = []
    try:
        for node in rest:
            if node.data == "dim":
                size_tok = node.children[0]
                size = _int(size_tok, text, "dim size")
                words.append((str(size), size_tok.start_pos))
                size_at.append(size_tok.start_pos)
                pairs, split, at, split_node = _dim_axes(node.children[1], text) if len(node.children) > 1 \
                    else ([], None, 0, None)
                words += pairs
                if split_node is not None:  # the type's checks of the split name it as their subject
                    words.append((str(split), split_node.meta.start_pos))
                try:
                    dims.append(Dim(size, tuple(n for n, _ in pairs), split, at))
                except SpecError as e:
                    if split_node is None or e.subject is not None:
                        raise
                    raise e.at(text, split_node.meta.start_pos) from None
            elif node.data == "annotations":
                for ann in node.children:
                    kind_tok, group = ann.children
                    local = _axis_type(kind_tok, text)
                    pairs = _names(group)
                    words += pairs
                    axis_types += [(name, local) for name, _ in pairs]
        sizes, itemsize = tuple(d.size for d in dims), DTYPES[dtype][1]
        over = byte_overflow(sizes, itemsize)
        if over is not None:  # the IR refuses it too; here the caret goes on the dim that overflows
            raise bytes_error(sizes, itemsize).at(text, size_at[over])
        invariant = tuple(a for a, at in axis_types if at.kind == "I")
        return TensorType(dtype, tuple(dims), tuple(axis_types)), invariant
    except SpecError as e:
        if e.text is not None:
            raise
        raise e.at(text, _caret(e, words, text, text.find("["))) from None


def _dim_axes(tree: Any, text: str) -> tuple[list[Any], Split | None, int, Any]:
    """A dim's axis list: (name, position) pairs, the split if one axis carries it, that
    axis's index and the split's tree node (for carets)."""
    pairs: list[Any] = []
    split, at, split_node = None, 0, None
    for item in tree.children:
        tok = item.children[0]
        if tok.type == "AXIS_CONT":
            name = tok.value[1:].strip()
            pairs.append((name, tok.start_pos + len(tok.value) - len(name)))
        else:
            pairs.append((tok.value, tok.start_pos))
        if len(item.children) > 1:
            if split_node is not None:
                raise SpecError("a dim has at most one uneven split", text=text,
                                pos=item.children[1].meta.start_pos,
                                hint="split one of the dim's axes unevenly; the others cut it evenly")
            split_node = item.children[1]
            split, at = _split(split_node, text), len(pairs) - 1
    return pairs, split, at, split_node


def _split(node: Any, text: str) -> Split:
    """An uneven split: ``<3,0,7>``, ``<ragged 1,2,1 over 2>``, ``<parts 4,6|2,4>``."""
    lists = [[_int(t, text, "size") for t in ch.children] for ch in node.children if hasattr(ch, "data")]
    try:
        if node.data == "sizes_split":
            return Split("sizes", tuple(lists[0]))
        if node.data == "ragged_split":
            toks = [ch for ch in node.children if not hasattr(ch, "data")]
            over = [t for t in toks if t.type == "INT"]
            return Split("ragged", tuple(lists[0]), span=_int(over[0], text, "span") if over else 1)
        head = next(ch for ch in node.children if not hasattr(ch, "data"))
        return Split("parts", tuple(map(tuple, lists)), aligned=head.value == "aligned")
    except SpecError as e:
        raise e.at(text, node.meta.start_pos) from None


def _axis_type(tok: Any, text: str) -> LocalType:
    raw = "".join(tok.value.split())  # U, R, I, V, P or P(op)
    try:
        return LocalType(raw[0], raw[2:-1] or "sum")
    except SpecError as e:
        raise e.at(text, tok.start_pos) from None


def parse_mesh(text: str | Mesh) -> Mesh:
    """Parse ``dp=2,tp=4`` (mesh order) into a ``Mesh``; a ``Mesh`` passes through."""
    if isinstance(text, Mesh):
        return text
    if not isinstance(text, str):
        raise SpecError(f"expected a mesh string, got {type(text).__name__}", hint=_MESH_HINT)
    return _parse_mesh(text)


@lru_cache(maxsize=1024)
def _parse_mesh(text: str) -> Mesh:
    tree = _run(text, "mesh_start", _MESH_HINT, "mesh").children[0]
    names: list[str] = []
    sizes: list[int] = []
    words: list[tuple[str, int]] = []
    ranks: list[int] | None = None
    for ax in tree.children:
        if ax.data == "rank_item":
            ranks = (ranks or []) + _rank_item(ax, text, words)
            continue
        name_tok, size_tok = ax.children
        size = _int(size_tok, text, "mesh axis size")
        words += [(name_tok.value, name_tok.start_pos), (str(size), size_tok.start_pos)]
        names.append(name_tok.value)
        sizes.append(size)
    try:
        return Mesh(tuple(names), tuple(sizes), None if ranks is None else tuple(ranks))
    except SpecError as e:
        raise e.at(text, _caret(e, words, text, text.find("@") if ranks is not None else None)) from None


def _rank_item(item: Any, text: str, words: list[tuple[str, int]]) -> list[int]:
    """``8`` or the run ``8-11`` of a mesh's global ranks (its words noted for carets)."""
    toks = item.children
    lo = _int(toks[0], text, "global rank")
    words.append((str(lo), toks[0].start_pos))
    if len(toks) == 1:
        return [lo]
    hi = _int(toks[1], text, "global rank")
    words.append((str(hi), toks[1].start_pos))
    if hi < lo:
        raise SpecError(f"the rank run {lo}-{hi} runs backwards", text=text, pos=toks[1].start_pos,
                        hint=f"write a run low to high ({hi}-{lo}), or list the ranks one by one")
    if hi - lo >= 1 << 20:
        raise SpecError(f"the rank run {lo}-{hi} is longer than a mesh may be", text=text, pos=toks[1].start_pos,
                        hint="a mesh has at most 2**20 ranks")
    return list(range(lo, hi + 1))


def parse_shard_order(text: str) -> dict[int, tuple[int | str, ...]]:
    """Parse ``{0: [1], 1: ['dp','tp']}``; mesh dims stay as given (index or name)."""
    if not isinstance(text, str):
        raise SpecError(f"expected a shard_order string, got {type(text).__name__}", hint=_ORDER_HINT)
    tree = _run(text, "order_start", _ORDER_HINT, "shard_order").children[0]
    out: dict[int, tuple[int | str, ...]] = {}
    for entry in tree.children:
        dim_tok, *refs = entry.children
        dim = _int(dim_tok, text, "tensor dim")
        if dim in out:
            raise SpecError(
                f"tensor dim {dim} appears twice in shard_order", text=text, pos=dim_tok.start_pos,
                hint="list each tensor dim once, with all the mesh dims that shard it",
            )
        vals: list[int | str] = []
        for ref in refs:
            tok = ref.children[0]
            if tok.type == "INT":
                vals.append(_int(tok, text, "mesh dim"))
            elif tok.type == "STRING":
                vals.append(tok.value[1:-1])
            else:
                vals.append(tok.value)
        out[dim] = tuple(vals)
    return out


# ---- calls: local types and placements --------------------------------------------------


@dataclass(frozen=True)
class Form:
    """What a name takes as a call: its parameters in order (their words, in errors; one that
    is not an identifier is positional only), how many are required, whether the bare name
    stands alone (``R``, ``P``), and other keywords for a parameter (``sf``)."""

    params: tuple[str, ...] = ()
    required: int = 0
    bare: bool = True
    aliases: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, eq=False)
class Call:
    """A call as read: its name, where it is written, and its arguments by parameter (ints,
    bools, None, strs, tuples for lists) with where each is written."""

    name: str
    pos: int
    args: Mapping[str, Any]
    at: Mapping[str, int]


def read_calls(text: str, forms: Mapping[str, Form], what: str, hint: str, one: bool = False) -> list[Call]:
    """``text`` as calls of the names in ``forms``: one call, or a list of them (bracketed or
    not, separated by commas or spaces); a caret on whatever does not fit."""
    tree = _run(text, "call_start" if one else "calls_start", hint, what if one else what + "s")
    try:
        return [_call(node, text, forms, what, hint) for node in tree.children]
    except RecursionError:
        raise SpecError(f"malformed {what}: too deeply nested", text=text, hint=hint) from None


def _call(node: Any, text: str, forms: Mapping[str, Form], what: str, hint: str) -> Call:
    """Python's rules for binding a call's arguments to the parameters of its form."""
    (name_tok, *args), pos = node.children, node.meta.start_pos
    name, form = name_tok.value, forms.get(name_tok.value)
    if form is None:
        raise SpecError(f"{name!r} is not a {what}", text=text, pos=pos, hint=hint)

    def fail(message: str, where: int) -> SpecError:
        return SpecError(f"{what} {name} {message}", text=text, pos=where,
                         hint=f"write {name}({', '.join(form.params)})" if form.params else hint)

    if not (form.bare if node.data == "bare_call" else form.params):
        raise fail("needs its arguments" if form.params else "takes no arguments", pos + len(name))
    keywords = dict(form.aliases) | {p: p for p in form.params if p.isidentifier()}
    values: dict[str, Any] = {}
    at: dict[str, int] = {}
    for i, arg in enumerate(args):
        if arg.data == "keyword_arg":
            key, value = arg.children
            param, where = keywords.get(key.value), key.start_pos
            if param is None:
                raise fail(f"has no argument {key.value!r}", where)
        else:
            (value,), where = arg.children, arg.meta.start_pos
            if any(a.data == "keyword_arg" for a in args[:i]):
                raise fail("takes no positional argument after a keyword one", where)
            if i >= len(form.params):
                raise fail(f"takes {len(form.params)} argument{'s' * (len(form.params) > 1)}, not {len(args)}", where)
            param = form.params[i]
        if param in values:
            raise fail(f"gets its {param} twice", where)
        values[param], at[param] = _value(value, text, param), where
    missing = [p for p in form.params[:form.required] if p not in values]
    if missing and node.data != "bare_call":
        raise fail(f"needs its {missing[0]}", node.meta.end_pos - 1)
    return Call(name, pos, values, at)


_CONSTANTS = {"True": True, "False": False, "None": None}


def _value(node: Any, text: str, what: str) -> Any:
    """A call's argument as a Python value (``what`` names it when a number is too long)."""
    kind, children = node.data, node.children
    if kind == "number":
        return _int(children[0], text, what)
    if kind == "negative":
        return -_int(children[0], text, what)
    if kind == "word":
        return _CONSTANTS.get(children[0].value, children[0].value)
    if kind == "quoted":
        return children[0].value[1:-1]
    if kind == "group":
        return _value(children[0], text, what)
    return tuple(_value(ch, text, what) for ch in children)


_LOCAL_FORMS = {**dict.fromkeys("RIVU", Form()), "P": Form(("reduce op",), 1), "S": Form(("tensor dim",), 1, bare=False)}


def parse_local_type(t: object, what: str = "type") -> LocalType:
    """A local SPMD type from itself or its text: ``R``, ``I``, ``V``, ``P``/``U``,
    ``P(avg)``, ``S(1)``; ``what`` names the argument in an error."""
    if isinstance(t, LocalType):
        return t
    if not isinstance(t, str):
        raise SpecError(f"the {what} {value_text(t)} is not a local SPMD type", hint=_LOCAL_HINT)
    try:
        return _local_type(t)
    except SpecError as e:
        raise SpecError(f"{what}: {e.message}", text=e.text, pos=e.pos, hint=e.hint) from None


@lru_cache(maxsize=1024)
def _local_type(text: str) -> LocalType:
    (call,) = read_calls(text, _LOCAL_FORMS, "local SPMD type", _LOCAL_HINT, one=True)
    try:
        if call.name == "S":
            return LocalType("S", dim=call.args["tensor dim"])
        return LocalType(call.name, call.args.get("reduce op", "sum"))
    except SpecError as e:
        raise e.at(text, next(iter(call.at.values()), call.pos)) from None
