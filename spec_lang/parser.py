"""Strings to IR: types, meshes and shard_order dicts, with caret errors."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from spec_lang.errors import SpecError, locate
from spec_lang.ir import AxisType, Dim, Mesh, TensorType
from spec_lang.split import Split

_TYPE_HINT = "write a type like f32[8@(dp,tp),16] or float32[8@dp,16]{U:tp}"
_MESH_HINT = "write a mesh like dp=2,tp=4 (axis=size, in mesh order)"
_ORDER_HINT = "write a shard_order like {0: [1], 1: ['dp', 'tp']}"


@lru_cache(maxsize=1)
def _lark() -> Any:
    from lark import Lark

    text = (Path(__file__).with_name("grammar.lark")).read_text()
    return Lark(
        text,
        start=["type_start", "mesh_start", "order_start"],
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=False,
    )


def _describe_expected(expected: set[str]) -> str:
    names = {
        "RSQB": "']'", "LSQB": "'['", "COMMA": "','", "RPAR": "')'", "LPAR": "'('",
        "RBRACE": "'}'", "LBRACE": "'{'", "COLON": "':'", "AT": "'@'", "EQUAL": "'='",
        "INT": "a number", "NAME": "an axis name", "KIND": "a local type (U, R, I, V, P(op))",
        "DTYPE": "a dtype", "AXIS_CONT": "',axis'", "STRING": "a quoted name",
        "LESSTHAN": "'<'", "MORETHAN": "'>'", "VBAR": "'|'", "RAGGED": "'ragged'", "OVER": "'over'",
        "PARTS": "'parts' or 'aligned'",
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
            f"malformed {what}: it ends too early (expected {_describe_expected(set(e.expected))})",
            text=text, pos=len(text), hint=hint,
        ) from None
    except UnexpectedToken as e:
        tok = e.token
        pos = len(text) if tok.type == "$END" else tok.start_pos
        got = "it ends too early" if tok.type == "$END" else f"unexpected {str(tok)!r}"
        raise SpecError(
            f"malformed {what}: {got} (expected {_describe_expected(set(e.expected))})",
            text=text, pos=pos, hint=hint,
        ) from None
    except UnexpectedCharacters as e:
        raise SpecError(
            f"malformed {what}: unexpected character {text[e.pos_in_stream]!r}",
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


def _int(tok: Any, text: str, what: str) -> int:
    """A number token as an int; past 19 digits it cannot fit int64, so say so before
    Python's int-string limit (4,300 digits) turns it into a ValueError."""
    digits = tok.value.lstrip("0") or "0"
    if len(digits) > 19:
        shown = tok.value if len(tok.value) <= 24 else tok.value[:12] + "..."
        raise SpecError(
            f"{what} {shown} ({len(tok.value)} digits) is too large", text=text, pos=tok.start_pos,
            hint="sizes must stay below 2**63",
        )
    return int(digits)


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


def parse(text: str) -> TensorType:
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
    dims: list[Dim] = []
    axis_types: list[tuple[str, AxisType]] = []
    try:
        for node in rest:
            if node.data == "dim":
                size_tok = node.children[0]
                size = _int(size_tok, text, "dim size")
                words.append((str(size), size_tok.start_pos))
                pairs, split, at, split_node = _dim_axes(node.children[1], text) if len(node.children) > 1 \
                    else ([], None, 0, None)
                words += pairs
                try:
                    dims.append(Dim(size, tuple(n for n, _ in pairs), split, at))
                except SpecError as e:
                    if split_node is None or e.subject is not None:
                        raise
                    raise e.at(text, split_node.meta.start_pos) from None
            elif node.data == "annotations":
                for ann in node.children:
                    kind_tok, group = ann.children
                    at = _axis_type(kind_tok, text)
                    pairs = _names(group)
                    words += pairs
                    axis_types += [(name, at) for name, _ in pairs]
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


def _axis_type(tok: Any, text: str) -> AxisType:
    raw = "".join(tok.value.split())
    try:
        if raw.startswith("P("):
            return AxisType("P", raw[2:-1])
        return AxisType(raw)
    except SpecError as e:
        raise e.at(text, tok.start_pos) from None


def parse_mesh(text: str) -> Mesh:
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
    for ax in tree.children:
        name_tok, size_tok = ax.children
        size = _int(size_tok, text, "mesh axis size")
        words += [(name_tok.value, name_tok.start_pos), (str(size), size_tok.start_pos)]
        names.append(name_tok.value)
        sizes.append(size)
    try:
        return Mesh(tuple(names), tuple(sizes))
    except SpecError as e:
        raise e.at(text, _caret(e, words, text, None)) from None


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
