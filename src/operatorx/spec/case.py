"""A case: one op (an op type of `spec/op_types.py`) with its args, and the checkpoint layers that run it."""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Mapping
from typing import Any, Literal, Optional

from pydantic import Field, PrivateAttr, SerializeAsAny, ValidationInfo, field_validator, model_validator

from operatorx.spec.base import Size, SpecModel
from operatorx.spec.op_type import OpArgs
from operatorx.spec.op_types import OP_TYPES, known_types
from operatorx.spec.parallel import Parallel
from operatorx.spec.spelling import todays_spelling

__all__ = ["Case", "Step", "name_problem"]

#: The serving step a scenario case belongs to (docs/serving.md).
Step = Literal["decode", "prefill"]

def _key_encoder() -> Any:
    """`json.dumps(value, sort_keys=True, separators=(",", ":"))`, the text of a case's key, with its C
    encoder made once (json.dumps makes one a call: a third of the time of a key)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:                                  # a Python without the C accelerator
        return json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
    encode = make(None, None, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, True)
    return lambda value: "".join(encode(value, 0))


_KEY_JSON = _key_encoder()

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_VISIBLE_ASCII = re.compile(r"[!-~]")


def name_problem(text: str) -> Optional[str]:
    """Why `text` cannot name a checkpoint layer or a recipe (None when it can): it is empty, or made
    only of invisible characters (spaces, zero-width and other format characters such as U+200B,
    U+2060, U+FEFF), or it holds a control character or a lone surrogate. Such a name shows as
    nothing (or moves the cursor) where it is printed, matches no checkpoint, and NUL or a
    surrogate cannot be stored (PostgreSQL's jsonb refuses both)."""
    bad = _CONTROL.search(text)
    if bad is not None:
        return f"holds the control character U+{ord(bad.group()):04X}; a name has none"
    bad = _SURROGATE.search(text)
    if bad is not None:
        return f"holds a lone surrogate (U+{ord(bad.group()):04X}, half a character): not text"
    if _VISIBLE_ASCII.search(text) is None and all(c.isspace() or unicodedata.category(c) == "Cf" for c in text):
        return "is empty" if not text.strip() else \
            "holds only invisible characters (zero-width or format characters such as U+200B)"
    return None


class Case(SpecModel):
    """One op to time. Two cases are equal when `type` and `args` are; `sources` never count.

    `sources` holds `<checkpoint>/<role>` strings. Older files give bare checkpoint ids in
    `sources` and the roles in a `name` list: one role per source, or a single role for every
    source. Those are joined on load.

    `recipes` (the serving recipes that use the case) and `metadata` (other top-level keys a
    testlist carried, kept as written) are metadata like `sources`: they never change `key()`.
    So are `count` (how many times one serving step runs the op) and `step` (`decode` or `prefill`),
    which `testlist serving` writes (docs/serving.md); absent (None) on other cases.
    """

    type: str
    args: SerializeAsAny[OpArgs]
    sources: list[str] = Field(default_factory=list)
    recipes: list[str] = Field(default_factory=list)
    count: Optional[Size] = None
    """How many times one step of a serving scenario runs this op (layers x per layer); None: not a
    scenario case."""
    step: Optional[Step] = None
    """The serving step (`decode` or `prefill`) that runs the op `count` times; None: not a scenario case."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    _key: Optional[str] = PrivateAttr(default=None)
    """`key()`, computed once: a run asks for it several times per case (merging, shards, rows, the
    store), and it costs a serialization of the args each time."""

    @model_validator(mode="before")
    @classmethod
    def _join_names(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = todays_spelling(data)
        if not isinstance(data, dict) or "name" not in data:
            return data
        data = dict(data)
        names = data.pop("name")
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError("name: a list of role strings")
        sources = data.get("sources", [])
        if not sources:
            data["sources"] = names
        elif isinstance(sources, list) and len(names) == 1:   # one role for every source
            data["sources"] = [f"{s}/{names[0]}" for s in sources]
        elif not isinstance(sources, list) or len(sources) != len(names):
            raise ValueError(f"name: {len(names)} roles for {len(sources) if isinstance(sources, list) else '?'} "
                             "sources; give one role per source, or a single role for all")
        else:
            data["sources"] = [f"{s}/{n}" for s, n in zip(sources, names, strict=True)]
        return data

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if value not in OP_TYPES:
            raise ValueError(f"{value!r} is not an op type OperatorX or upstream defines (known: {known_types()})")
        return value

    @field_validator("args", mode="wrap")
    @classmethod
    def _args_of_type(cls, value: Any, handler: Any, info: ValidationInfo) -> Any:
        model = OP_TYPES.get(info.data.get("type", ""))
        if model is None:       # the type's own error says what is wrong; args cannot be read without it
            return value
        return value if isinstance(value, model) else model.model_validate(value)

    @field_validator("sources", "recipes")
    @classmethod
    def _named(cls, items: list[str], info: ValidationInfo) -> list[str]:
        for i, s in enumerate(items):
            why = name_problem(s)
            if why is not None:
                raise ValueError(f"{info.field_name}[{i}] {why}")
        return items

    # --- identity -------------------------------------------------------------------------
    def args_dict(self) -> dict[str, Any]:
        """The args as plain JSON data, optional fields left out when unset, `parallel` last (as
        upstream's files write it)."""
        out: dict[str, Any] = self.args.__pydantic_serializer__.to_python(self.args, mode="json", exclude_none=True)
        if "parallel" in out:
            out["parallel"] = out.pop("parallel")
        return out

    def key(self) -> str:
        """Canonical identity: type and args as sorted JSON."""
        private = self.__pydantic_private__         # read directly: `self._key` costs ~3 µs (pydantic's __getattr__)
        assert private is not None
        key: Optional[str] = private["_key"]
        if key is None:
            key = _KEY_JSON({"type": self.type, "args": self.args_dict()})
            private["_key"] = key
        return key

    def model_copy(self, *, update: Optional[Mapping[str, Any]] = None, deep: bool = False) -> Case:
        """A copy; the cached key goes with it only when the update leaves type and args alone."""
        copy = super().model_copy(update=update, deep=deep)
        if update and ("type" in update or "args" in update) and copy.__pydantic_private__ is not None:
            copy.__pydantic_private__["_key"] = None
        return copy

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Case) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def seed(self) -> int:
        """A seed for the case's synthetic inputs: the same case gets the same data in every backend
        and every process, so A/B sides and reruns compare like with like."""
        return int(hashlib.sha256(self.key().encode()).hexdigest()[:8], 16)

    def to_json(self) -> dict[str, Any]:
        """The case as a testlist writes it (and `Case.model_validate` reads back exactly); count, step,
        recipes and metadata only when there are some."""
        out: dict[str, Any] = {"type": self.type, "args": self.args_dict(), "sources": list(self.sources)}
        if self.count is not None:
            out["count"] = self.count
        if self.step is not None:
            out["step"] = self.step
        if self.recipes:
            out["recipes"] = list(self.recipes)
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        return out

    # --- what the op is and costs (the op type answers) -------------------------------------
    @property
    def implemented(self) -> bool:
        """False for an upstream op type this version loads but has no backend for yet."""
        return type(self.args).IMPLEMENTED

    @property
    def family(self) -> str:
        """The op family (`gemm`, `moe`, `attention`)."""
        return type(self.args).FAMILY

    @property
    def parallel(self) -> Optional[Parallel]:
        """The split the case runs under (None: one device)."""
        return self.args.parallel

    @property
    def world(self) -> int:
        """The ranks the case runs over: tp·dp (1 without a split)."""
        return 1 if self.args.parallel is None else self.args.parallel.world

    def flops(self) -> int:
        return self.args.flops()

    def min_bytes(self) -> int:
        return self.args.min_bytes()

    def scheme(self) -> str:
        return self.args.scheme()

    def label(self) -> str:
        """A short human label: `gemm 1x7168x2048`, `gemm 8x7168x33792 tp8`, `moe T=8 E=256 k=8 ...`."""
        return self.args.label()

    def with_sources(self, sources: list[str]) -> Case:
        return self.model_copy(update={"sources": list(sources)})


