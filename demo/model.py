"""Print the demo's DisaggregatedModel with what only this machine knows filled in.

examples/demo-cpu.yaml names the CPU serving image and the router image by repository; this
sets their tags to the ones ``images.sh build`` made (keyed by their inputs, so they change with
the sources) and points the model cache at the folder on the node that holds the locally made
model, made first when missing and readable by the pods' user (with --namespace it puts the
model in another namespace: the e2e tests' own). Everything else is applied as the example says.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from disagg.rig.bench_model import MODEL_DIR, ensure_bench_model


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("example", type=Path, help="the DisaggregatedModel YAML")
    parser.add_argument("--serving-image", required=True, help="repository:tag")
    parser.add_argument("--router-image", required=True, help="repository:tag")
    parser.add_argument("--namespace", help="instead of the example's")
    return parser.parse_args()


def _image(reference: str, pull_policy: str) -> dict[str, str]:
    repository, _, tag = reference.rpartition(":")
    return {"repository": repository, "tag": tag, "pullPolicy": pull_policy}


def filled(model: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The model with the images' tags and the node's model cache folder."""
    spec = model["spec"]
    spec["image"] = _image(args.serving_image, spec["image"]["pullPolicy"])
    router = spec["router"]
    router["image"] = _image(args.router_image, router["image"]["pullPolicy"])
    spec["model"]["cache"]["hostPath"]["path"] = str(MODEL_DIR.parent)
    if args.namespace:
        model["metadata"]["namespace"] = args.namespace
    return model


def readable_model() -> None:
    """Make the model once; let the serving image's user (not root) read it on the node."""
    ensure_bench_model()
    for path in [MODEL_DIR, *MODEL_DIR.iterdir()]:
        path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))


def main() -> int:
    args = parse_args()
    readable_model()
    model = yaml.safe_load(args.example.read_text())
    yaml.safe_dump(filled(model, args), sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
