"""Strings to IR: types, meshes and shard_order dicts, with caret errors."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from spec_lang.errors import SpecError
from spec_lang.ir import REDUCE_OPS, AxisType, Dim, Mesh, TensorType, canonical_dtype

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
    value = int(tok.value)
    if value > 2**62:
        raise SpecError(f"{what} {tok.value} is too large", text=text, pos=tok.start_pos)
    return value


def parse(text: str) -> TensorType:
    """Parse a type string (``f32[8@(dp,tp),16]{U:tp}``) into a ``TensorType``.

    A ``TensorType`` passes through unchanged.
    """
    if isinstance(text, TensorType):
        return text
    if not isinstance(text, str):
        raise SpecError(f"expected a type string, got {type(text).__name__}", hint=_TYPE_HINT)
    return _parse_type(text)


@lru_cache(maxsize=4096)
def _parse_type(text: str) -> TensorType:
    tree = _run(text, "type_start", _TYPE_HINT, "type").children[0]
    dtype_tok, *rest = tree.children
    dtype = canonical_dtype(dtype_tok.value)
    if dtype is None:
        raise SpecError(
            f"unknown dtype {dtype_tok.value!r}", text=text, pos=dtype_tok.start_pos,
            hint="use f32, bf16, f16, f64, i8, i16, i32, i64, u8, bool or their long names (float32, ...)",
        )
    seen: dict[str, int] = {}

    def claim(name: str, pos: int) -> None:
        if name in seen:
            raise SpecError(
                f"mesh axis {name!r} is used twice in one type", text=text, pos=pos,
                hint="a mesh axis may shard one dim or carry one local type, not both or twice",
            )
        seen[name] = pos

    dims: list[Dim] = []
    axis_types: list[tuple[str, AxisType]] = []
    for node in rest:
        if node.data == "dim":
            size_tok = node.children[0]
            axes: tuple[str, ...] = ()
            if len(node.children) > 1:
                pairs = _names(node.children[1])
                for name, pos in pairs:
                    claim(name, pos)
                axes = tuple(n for n, _ in pairs)
            dims.append(Dim(_int(size_tok, text, "dim size"), axes))
        elif node.data == "annotations":
            for ann in node.children:
                kind_tok, group = ann.children
                at = _axis_type(kind_tok, text)
                for name, pos in _names(group):
                    claim(name, pos)
                    axis_types.append((name, at))
    ops = {at.op for _, at in axis_types if at.kind == "P"}
    if len(ops) > 1:
        raise SpecError(
            f"mixed reduce ops {sorted(ops)} in one type", text=text, pos=text.find("{"),
            hint="the order of a mixed reduction changes its value; reduce one op first",
        )
    return TensorType(dtype, tuple(dims), tuple(axis_types))


def _axis_type(tok: Any, text: str) -> AxisType:
    raw = "".join(tok.value.split())
    if raw == "U":
        return AxisType("P", "sum")
    if raw.startswith("P"):
        op = raw[2:-1] if raw.startswith("P(") else "sum"
        if op not in REDUCE_OPS:
            raise SpecError(
                f"unknown reduce op {op!r}", text=text, pos=tok.start_pos,
                hint="use P(sum), P(avg), P(max) or P(min); U is P(sum)",
            )
        return AxisType("P", op)
    return AxisType(raw)


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
    for ax in tree.children:
        name_tok, size_tok = ax.children
        if name_tok.value in names:
            raise SpecError(
                f"mesh axis {name_tok.value!r} is repeated", text=text, pos=name_tok.start_pos,
                hint="give each mesh axis a unique name",
            )
        size = _int(size_tok, text, "mesh axis size")
        if size < 1:
            raise SpecError(
                f"mesh axis {name_tok.value!r} has size 0", text=text, pos=size_tok.start_pos,
                hint="mesh axis sizes are at least 1",
            )
        names.append(name_tok.value)
        sizes.append(size)
    return Mesh(tuple(names), tuple(sizes))


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
                vals.append(int(tok.value))
            elif tok.type == "STRING":
                vals.append(tok.value[1:-1])
            else:
                vals.append(tok.value)
        out[dim] = tuple(vals)
    return out
