"""The base of every API model and the cross-field rules it enforces.

A :class:`CrossFieldRule` holds one rule twice, as a Python predicate (checked by the model's
validator) and as a CEL expression (emitted by :mod:`gen_crd` into the CRD's
``x-kubernetes-validations``), with one message, so the model and the API server refuse the same
specs with the same words (the models may add which item broke the rule).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

CROSS_FIELD_ERROR = "cross_field"


@dataclass(frozen=True)
class CrossFieldRule:
    """One rule over a model's fields.

    ``field`` is the offending field's path relative to the model (camelCase, dotted), ``cel``
    the CEL expression with ``self`` bound to the model's object, ``check`` the same predicate in
    Python; both must be true for a valid object. ``explain``, when set, says what in a refused
    object breaks the rule (which item, which field to set instead); the models append it to the
    message, which CEL cannot compute per object.
    """

    field: str
    message: str
    cel: str
    check: Callable[[Any], bool]
    explain: Callable[[Any], str] | None = None


class ApiModel(BaseModel):
    """Base of the CRD's models: camelCase names, unknown fields and type coercion refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        serialize_by_alias=True,
        extra="forbid",
        strict=True,
        frozen=True,
    )

    rules: ClassVar[tuple[CrossFieldRule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> Self:
        for rule in type(self).rules:
            if not rule.check(self):
                message = rule.message
                if rule.explain is not None:
                    message = f"{message}: {rule.explain(self)}"
                raise PydanticCustomError(
                    CROSS_FIELD_ERROR,
                    "{field}: {message}",
                    {"field": rule.field, "message": message},
                )
        return self
