"""An offline stand-in for the API server's admission of a custom resource against our CRD.

It applies the structural schema's defaults, validates the OpenAPI constraints (jsonschema),
refuses unknown fields (kubectl's strict field validation) and evaluates every CEL rule with
cel-python on the object as the API server hands it to CEL (property names that are CEL
reserved words escaped), reporting each problem as `path: message` with the rule's `fieldPath`
appended, as the API server does. The cluster tests check the same against a real kube-apiserver.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from functools import cache
from typing import Any

import celpy
import jsonschema
import yaml
from celpy.adapter import json_to_cel
from celpy.celtypes import BoolType
from celpy.evaluation import CELEvalError

from disagg_operator.errors import field_path
from gen_crd import crd_yaml

Schema = dict[str, Any]


@cache
def root_schema() -> Schema:
    """The openAPIV3Schema of the generated CRD (shared: callers must not modify it)."""
    crd = yaml.safe_load(crd_yaml())
    schema: Schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def apply_defaults(obj: Any, schema: Schema) -> Any:
    """Structural defaulting: fill absent properties that declare a default, recursively."""
    if isinstance(obj, dict):
        properties = schema.get("properties", {})
        for name, prop in properties.items():
            if name not in obj and "default" in prop:
                obj[name] = copy.deepcopy(prop["default"])
        for name, value in obj.items():
            if name in properties:
                apply_defaults(value, properties[name])
            elif isinstance(schema.get("additionalProperties"), dict):
                apply_defaults(value, schema["additionalProperties"])
    elif isinstance(obj, list) and "items" in schema:
        for item in obj:
            apply_defaults(item, schema["items"])
    return obj


def _schema_errors(obj: Any, schema: Schema) -> Iterator[str]:
    for error in jsonschema.Draft4Validator(schema).iter_errors(obj):
        loc = list(error.absolute_path)
        if error.validator == "required":
            missing = [name for name in error.validator_value if name not in error.instance]
            for name in missing:
                yield f"{field_path([*loc, name])}: Required value"
        else:
            yield f"{field_path(loc)}: {error.message}"


def _unknown_fields(obj: Any, schema: Schema, loc: list[int | str]) -> Iterator[str]:
    if isinstance(obj, dict):
        properties = schema.get("properties")
        for name, value in obj.items():
            if properties is not None and name in properties:
                yield from _unknown_fields(value, properties[name], [*loc, name])
            elif isinstance(schema.get("additionalProperties"), dict):
                yield from _unknown_fields(value, schema["additionalProperties"], [*loc, name])
            elif properties is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                yield f"{field_path([*loc, name])}: field not declared in schema"
    elif isinstance(obj, list) and "items" in schema:
        for index, item in enumerate(obj):
            yield from _unknown_fields(item, schema["items"], [*loc, index])


CEL_RESERVED = frozenset(
    {"true", "false", "null", "in", "as", "break", "const", "continue", "else", "for",
     "function", "if", "import", "let", "loop", "package", "namespace", "return", "var", "void",
     "while"}
)  # fmt: skip
"""Property names the API server hands CEL rules escaped as `__name__` (k8s.io/apiserver's
pkg/cel escaping): a rule reads a `namespace` property as `self.__namespace__`."""
_CEL_ESCAPES = (("__", "__underscores__"), (".", "__dot__"), ("-", "__dash__"), ("/", "__slash__"))


def cel_name(name: str) -> str:
    """A schema property's name as CEL rules see it."""
    if name in CEL_RESERVED:
        return f"__{name}__"
    for plain, escaped in _CEL_ESCAPES:
        name = name.replace(plain, escaped)
    return name


def _as_cel_sees(obj: Any, schema: Schema) -> Any:
    """`obj` with its declared properties named as CEL rules see them (map keys stay)."""
    if isinstance(obj, dict):
        properties = schema.get("properties")
        if properties is not None:
            return {
                cel_name(k) if k in properties else k: _as_cel_sees(v, properties.get(k, {}))
                for k, v in obj.items()
            }
        values = schema.get("additionalProperties")
        if isinstance(values, dict):
            return {k: _as_cel_sees(v, values) for k, v in obj.items()}
    elif isinstance(obj, list) and "items" in schema:
        return [_as_cel_sees(item, schema["items"]) for item in obj]
    return obj


@cache
def _program(rule: str) -> celpy.Runner:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def cel_failures(obj: Any, schema: Schema, loc: list[int | str]) -> Iterator[str]:
    """`path: message` for every CEL rule that does not hold on `obj` or below it."""
    for rule in schema.get("x-kubernetes-validations", []):
        try:
            seen = json_to_cel(_as_cel_sees(obj, schema))
            result = _program(rule["rule"]).evaluate({"self": seen})
        except CELEvalError:  # e.g. "no such key": the API server refuses those too
            result = None
        if not (isinstance(result, BoolType) and bool(result)):
            path = field_path([*loc, *rule.get("fieldPath", "").lstrip(".").split(".")])
            yield f"{path}: {rule['message']}"
    if isinstance(obj, dict):
        for name, value in obj.items():
            if name in schema.get("properties", {}):
                yield from cel_failures(value, schema["properties"][name], [*loc, name])
    elif isinstance(obj, list) and "items" in schema:
        for index, item in enumerate(obj):
            yield from cel_failures(item, schema["items"], [*loc, index])


def admission_errors(obj: dict[str, Any]) -> list[str]:
    """What the API server would refuse in `obj` (after defaulting), as `path: message`."""
    schema = root_schema()
    defaulted = apply_defaults(copy.deepcopy(obj), schema)
    # metadata is the API server's ObjectMeta: only name's constraints come from the CRD.
    body = {key: value for key, value in defaulted.items() if key != "metadata"}
    errors = [*_schema_errors(defaulted, schema), *_unknown_fields(body, schema, [])]
    if not errors:
        errors = list(cel_failures(defaulted, schema, []))
    return errors
