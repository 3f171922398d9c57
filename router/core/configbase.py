"""The base of every config model: frozen, no unknown keys, field docstrings, no booleans for numbers; and the
error a cross-field validator raises with the path of the key at fault."""

from __future__ import annotations

import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, model_validator

PosFloat = Annotated[float, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosInt = Annotated[int, Field(gt=0)]


class At(ValueError):
    """A cross-field error raised inside a validator, carrying the path of the offending key."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


def annotation_kinds(annotation: Any) -> set[Any]:
    """The plain types an annotation admits (through ``Annotated``, ``Optional`` and unions)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return annotation_kinds(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return set().union(*(annotation_kinds(a) for a in get_args(annotation)))
    return {annotation}


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        """``kv_budget_tokens: true`` is a mistake, not 1: pydantic's lax mode would take a boolean for a
        number (a number written as a string stays accepted, as ``${VAR}`` values are strings)."""
        if isinstance(data, dict):
            for key, value in data.items():
                field = cls.model_fields.get(key) if isinstance(key, str) else None
                if field is not None and isinstance(value, bool):
                    kinds = annotation_kinds(field.annotation)
                    if bool not in kinds and kinds & {int, float}:
                        raise At((key,), f"expected a number, not {str(value).lower()}")
        return data
