"""Test data for the kiln package's tests: the models and ONNX Runtime's reference
outputs that scripts/setup-test-data and scripts/ref_outputs.py make, under
$KILN_TEST_DATA (default: <repo>/.cache). Missing data fails the tests; it does not
skip them."""

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    d = Path(os.environ.get("KILN_TEST_DATA", REPO / ".cache"))
    manifest = d / "ref" / "manifest.json"
    if not manifest.is_file():
        pytest.fail(f"{manifest} is missing: run scripts/setup-test-data and scripts/ref_outputs.py (scripts/test does)")
    return d


@pytest.fixture(scope="session")
def manifest(data_dir):
    m = json.loads((data_dir / "ref" / "manifest.json").read_text())
    return {e["name"]: e for e in m["models"]}
