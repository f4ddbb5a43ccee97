"""What the connector needs from vLLM, checked in the vLLM this interpreter imports.

No engine runs: the connector's modules are imported and compared with vLLM's classes and
sources. Checked: every vLLM name the connector imports (``TYPE_CHECKING`` ones included);
every method it overrides (marked ``@override``, same parameters as vLLM's, and no unmarked
method shadowing one of vLLM's); every attribute it uses on ``self``, on annotated parameters
and on vLLM objects it builds (set or declared by vLLM's classes); the base ``__init__`` it skips
sets nothing it does not set itself; the ``kv_connector_extra_config`` keys the launcher accepts
are the ones the NIXL pull connector reads; the ``kv_transfer_params`` keys the connector reads
are ones vLLM's pull scheduler publishes; vLLM streams ``kv_transfer_params`` itself exactly
when the stream plugin stands down; the engine's input queue exists before the scheduler is
built (idle wait); and :mod:`vllm_cli_fit`'s checks of every example's rendered server command
against vLLM's own argument parser (run with :data:`vllm_cli_fit.PLATFORM_ENV` set).

``python vllm_fit.py REPORT`` writes ``{"vllm": <version>, "problems": [...]}`` as JSON to REPORT
(vLLM logs to stdout).
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import json
import sys
import textwrap
import types
import typing
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from disagg_connector.vllm_options import module_tree
from vllm_cli_fit import cli_problems

CONNECTOR_MODULES = (
    "disagg_connector.connector",
    "disagg_connector.scheduler",
    "disagg_connector.stats",
    "disagg_connector.nixl_pacing",
    "disagg_connector.idle_wait",
    "disagg_connector.stream_params",
    "disagg_connector.launcher",
)
PARAMS_KEY_PREFIXES = ("remote_", "do_remote_")
"""vLLM's own ``kv_transfer_params`` keys; the connector's additions are named otherwise."""
SOURCES_READING_PARAMS = ("disagg_connector.scheduler", "disagg_connector.reuse_plan")


def in_vllm(name: str) -> bool:
    """Whether a module name belongs to vLLM."""
    return name == "vllm" or name.startswith("vllm.")


def vllm_bases(cls: type) -> list[type]:
    """vLLM classes in ``cls``'s MRO, nearest first (``cls`` itself excluded)."""
    return [base for base in cls.__mro__[1:] if in_vllm(base.__module__)]


@functools.cache
def source_tree(obj: Any) -> ast.AST:
    """The parsed source of a class, function or module."""
    return ast.parse(textwrap.dedent(inspect.getsource(obj)))


def definition(obj: Any) -> ast.AST:
    """The class or function node of ``obj``'s source."""
    return typing.cast(ast.Module, source_tree(obj)).body[0]


def attribute_uses(
    node: ast.AST, owner: str, ctx: type[ast.expr_context] | None = None
) -> set[str]:
    """Names of ``owner.<name>`` attributes under ``node`` (only stores or loads if ``ctx``)."""
    return {
        sub.attr
        for sub in ast.walk(node)
        if isinstance(sub, ast.Attribute)
        and isinstance(sub.value, ast.Name)
        and sub.value.id == owner
        and (ctx is None or isinstance(sub.ctx, ctx))
    }


def defined_attributes(classes: Iterable[type]) -> set[str]:
    """Attributes instances of ``classes`` have: class members, annotations, ``self.x`` stores."""
    names: set[str] = set()
    for cls in classes:
        for klass in cls.__mro__:
            if klass is object:
                continue
            names |= set(vars(klass)) | set(vars(klass).get("__annotations__", {}))
            if in_vllm(klass.__module__):
                names |= attribute_uses(source_tree(klass), "self", ast.Store)
    return names


def parameters(func: Any) -> str:
    """``func``'s parameters with their kinds and defaults; annotations are ours to choose."""
    signature = inspect.signature(func)
    bare = [
        param.replace(annotation=inspect.Parameter.empty) for param in signature.parameters.values()
    ]
    return str(signature.replace(parameters=bare, return_annotation=inspect.Signature.empty))


def override_problems(cls: type) -> list[str]:
    """Overrides of vLLM methods that vLLM would not call, or call with other arguments."""
    problems: list[str] = []
    bases = vllm_bases(cls)
    for name, member in vars(cls).items():
        if not isinstance(member, types.FunctionType | classmethod | staticmethod):
            continue
        where = f"{cls.__qualname__}.{name}"
        owner = next((base for base in bases if name in vars(base)), None)
        marked = getattr(getattr(cls, name), "__override__", False)
        if owner is None:
            if marked:
                problems.append(f"{where} is marked @override but no vLLM base defines {name}")
            continue
        theirs = f"{owner.__module__}.{owner.__qualname__}.{name}"
        if not marked and name != "__init__":
            problems.append(f"{where} overrides {theirs} without @override")
        if type(member) is not type(vars(owner)[name]):
            problems.append(f"{where} is a {type(member).__name__}, {theirs} is not")
        ours_params, their_params = parameters(getattr(cls, name)), parameters(getattr(owner, name))
        if ours_params != their_params:
            problems.append(f"{where}{ours_params} does not match {theirs}{their_params}")
    return problems


def skipped_init_problems(cls: type) -> list[str]:
    """Attributes a base ``__init__`` that ``cls.__init__`` skips (``super(Base, self)``) sets."""
    init = vars(cls).get("__init__")
    if not isinstance(init, types.FunctionType):
        return []
    tree = definition(init)
    ours = attribute_uses(tree, "self", ast.Store)
    problems: list[str] = []
    for call in ast.walk(tree):
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "__init__"
            and isinstance(call.func.value, ast.Call)
            and isinstance(call.func.value.func, ast.Name)
            and call.func.value.func.id == "super"
            and call.func.value.args
            and isinstance(call.func.value.args[0], ast.Name)
        ):
            continue
        skipped = init.__globals__[call.func.value.args[0].id]
        theirs = attribute_uses(definition(skipped.__init__), "self", ast.Store)
        problems += [
            f"{cls.__qualname__}.__init__ skips {skipped.__qualname__}.__init__, which sets "
            f"self.{name}; set it too"
            for name in sorted(theirs - ours)
        ]
    return problems


def vllm_classes_in(hint: Any) -> list[type]:
    """vLLM classes a parameter annotation names (``X`` or ``X | None``)."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    return [option for option in options if isinstance(option, type) and in_vllm(option.__module__)]


def typed_names(
    func: types.FunctionType, namespace: dict[str, Any]
) -> Iterator[tuple[str, list[type]]]:
    """Parameters annotated with vLLM classes, and locals assigned a new vLLM object."""
    hints = typing.get_type_hints(func, globalns=namespace)
    for name, hint in hints.items():
        if name != "return" and (classes := vllm_classes_in(hint)):
            yield name, classes
    for node in ast.walk(definition(func)):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and (classes := vllm_classes_in(namespace.get(node.value.func.id)))
        ):
            yield node.targets[0].id, classes


def attribute_problems(cls: type, namespace: dict[str, Any]) -> list[str]:
    """Attributes ``cls`` uses that vLLM's classes do not define."""
    bases = vllm_bases(cls)
    tree = definition(cls)
    ours = set(vars(cls)) | attribute_uses(tree, "self", ast.Store)
    problems = [
        f"{cls.__qualname__} uses self.{name}, which {bases[0].__qualname__} does not define"
        for name in sorted(attribute_uses(tree, "self") - ours - defined_attributes(bases))
    ]
    for name, member in vars(cls).items():
        func = member.__func__ if isinstance(member, classmethod | staticmethod) else member
        if not isinstance(func, types.FunctionType):
            continue
        for variable, classes in typed_names(func, namespace):
            problems += [
                f"{cls.__qualname__}.{name} uses {variable}.{attr}, which "
                f"{classes[0].__qualname__} does not define"
                for attr in sorted(
                    attribute_uses(definition(func), variable) - defined_attributes(classes)
                )
            ]
    return problems


def annotation_namespace(module: types.ModuleType) -> tuple[dict[str, Any], list[str]]:
    """``module``'s globals plus its ``if TYPE_CHECKING:`` imports, and the imports that fail."""
    namespace = dict(vars(module))
    problems: list[str] = []
    for node in typing.cast(ast.Module, source_tree(module)).body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"):
            continue
        for statement in node.body:
            code = compile(
                ast.Module(body=[statement], type_ignores=[]), str(module.__file__), "exec"
            )
            try:
                exec(code, namespace)
            except ImportError as exc:
                problems.append(f"{module.__name__}: `{ast.unparse(statement)}` fails: {exc}")
    return namespace, problems


def module_attribute_problems(module: types.ModuleType) -> list[str]:
    """``vllm_module.name`` uses in ``module`` whose name the vLLM module lacks."""
    problems = []
    for node in ast.walk(source_tree(module)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            target = vars(module).get(node.value.id)
            if (
                isinstance(target, types.ModuleType)
                and in_vllm(target.__name__)
                and not hasattr(target, node.attr)
            ):
                problems.append(f"{module.__name__} uses {target.__name__}.{node.attr}: missing")
    return problems


def class_problems(module: types.ModuleType) -> list[str]:
    """Every check on the vLLM subclasses ``module`` defines."""
    namespace, problems = annotation_namespace(module)
    problems += module_attribute_problems(module)
    for cls in vars(module).values():
        if isinstance(cls, type) and cls.__module__ == module.__name__ and vllm_bases(cls):
            problems += override_problems(cls)
            problems += skipped_init_problems(cls)
            problems += attribute_problems(cls, namespace)
    return problems


def string_calls(tree: ast.AST, method: str) -> set[str]:
    """Constant first arguments of ``<anything>.<method>("...")`` calls."""
    return {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == method
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    }


def pull_connector_modules() -> set[types.ModuleType]:
    """vLLM modules defining the classes the connector runs on (facade, scheduler, worker)."""
    connector = importlib.import_module("disagg_connector.connector")
    roots = (
        connector.DisaggConnector,
        connector.DisaggConnectorScheduler,
        connector.NixlPullConnectorWorker,
    )
    return {
        typing.cast(types.ModuleType, inspect.getmodule(klass))
        for root in roots
        for klass in root.__mro__
        if in_vllm(klass.__module__)
    }


def extra_config_problems() -> list[str]:
    """Extra-config keys the launcher and vLLM's NIXL pull connector disagree on."""
    from disagg_connector.launch_config import EXTRA_KEY_TYPES

    read: set[str] = set()
    for module in pull_connector_modules():
        read |= string_calls(source_tree(module), "get_from_extra_config")
    return [
        f"vLLM's NIXL pull connector reads kv_connector_extra_config.{key}; the launcher refuses it"
        for key in sorted(read - set(EXTRA_KEY_TYPES))
    ] + [
        f"the launcher accepts kv_connector_extra_config.{key}; vLLM's NIXL pull connector "
        "never reads it"
        for key in sorted(set(EXTRA_KEY_TYPES) - read)
    ]


def published_keys(tree: ast.AST) -> set[str]:
    """Keys of ``dict(key=...)`` calls and ``{"key": ...}`` literals under ``tree``."""
    keys: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "dict"
        ):
            keys |= {keyword.arg for keyword in node.keywords if keyword.arg}
        elif isinstance(node, ast.Dict):
            keys |= {
                key.value
                for key in node.keys
                if isinstance(key, ast.Constant) and isinstance(key.value, str)
            }
    return keys


def read_keys(tree: ast.AST) -> set[str]:
    """String keys read with ``x["key"]`` or ``x.get("key")`` under ``tree``."""
    subscripts = {
        node.slice.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
    }
    return subscripts | string_calls(tree, "get")


def params_key_problems() -> list[str]:
    """vLLM ``kv_transfer_params`` keys the connector reads that vLLM's pull scheduler lacks."""
    scheduler = importlib.import_module("disagg_connector.scheduler")
    published: set[str] = set()
    for base in vllm_bases(scheduler.DisaggConnectorScheduler):
        published |= published_keys(source_tree(base))
    used: set[str] = set()
    for name in SOURCES_READING_PARAMS:
        used |= read_keys(source_tree(importlib.import_module(name)))
    return [
        f"the connector reads kv_transfer_params[{key!r}], which vLLM's pull scheduler does not "
        "publish"
        for key in sorted(used - published)
        if key.startswith(PARAMS_KEY_PREFIXES)
    ]


def class_definition(module_name: str, class_name: str) -> ast.ClassDef:
    """A class's node in its module's source file, read without importing the module.

    vLLM 0.33's serving modules import packages (orjson) that the engine venv, built for vLLM
    0.32, lacks; their sources are read instead.
    """
    for node in module_tree(module_name).body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return node
    raise LookupError(f"class {class_name} is gone from {module_name}")


def streams_params_natively(owner: ast.ClassDef) -> bool:
    """Whether an OpenAI serving class builds stream chunks with ``kv_transfer_params``."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id.endswith("StreamResponse")
        and any(keyword.arg == "kv_transfer_params" for keyword in node.keywords)
        for node in ast.walk(owner)
    )


def stream_problems(version: str) -> list[str]:
    """The stream plugin must stand down exactly where vLLM streams the params itself."""
    from disagg_connector import stream_params

    plugin_patches = stream_params.needs_stream_params(version)
    problems = []
    for module_name, class_name, method_name in stream_params.PATCHED_GENERATORS:
        where = f"{module_name}.{class_name}"
        try:
            owner = class_definition(module_name, class_name)
        except LookupError as exc:
            problems.append(f"the stream plugin's target {where}: {exc}")
            continue
        if streams_params_natively(owner) == plugin_patches:
            problems.append(
                f"{where} {'streams' if plugin_patches else 'does not stream'} "
                f"kv_transfer_params, but the plugin {'patches' if plugin_patches else 'skips'} "
                f"vLLM {version}"
            )
        if plugin_patches:
            method = getattr(getattr(importlib.import_module(module_name), class_name), method_name)
            if "result_generator" not in inspect.signature(method).parameters:
                problems.append(f"{where}.{method_name} takes no result_generator to wrap")
    return problems


def idle_wait_problems() -> list[str]:
    """The idle wait finds ``self.input_queue`` up the stack while the scheduler is built."""
    from vllm.v1.engine.core import EngineCoreProc

    tree = definition(EngineCoreProc.__init__)
    queue_set = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and "input_queue" in attribute_uses(node, "self", ast.Store)
        and ast.unparse(node.value or ast.Constant(None)).startswith("queue.Queue")
    ]
    super_init = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "super().__init__"
    ]
    if queue_set and super_init and min(queue_set) < min(super_init):
        return []
    return [
        "EngineCoreProc.__init__ no longer sets self.input_queue (a queue.Queue) before "
        "building the engine core and its scheduler: DISAGG_IDLE_STEP_WAIT_MS finds no queue"
    ]


def report() -> dict[str, Any]:
    """Run every check; import failures stop the checks that need the module."""
    from disagg_connector.vllm_version import installed_vllm_version

    version = installed_vllm_version() or "none"
    modules = []
    problems: list[str] = []
    for name in CONNECTOR_MODULES:
        try:
            modules.append(importlib.import_module(name))
        except ImportError as exc:
            problems.append(f"import {name} fails: {exc}")
    if problems:
        return {"vllm": version, "problems": problems}
    for module in modules:
        problems += class_problems(module)
    problems += extra_config_problems()
    problems += params_key_problems()
    problems += stream_problems(version)
    problems += idle_wait_problems()
    problems += cli_problems()
    return {"vllm": version, "problems": problems}


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(json.dumps(report(), indent=1))
