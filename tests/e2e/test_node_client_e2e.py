"""End-to-end: a Node.js client (@grpc/grpc-js + @grpc/proto-loader from npm) against the real stack.

Only ``proto/`` is shared with the client: it loads ``ninfer/v1/generation.proto`` and decodes the
error trailer with the shipped ``google/rpc/status.proto``. The npm packages are pinned by
``tests/e2e/node/package-lock.json`` and installed with ``npm ci`` into the git-ignored
``tests/e2e/node/node_modules`` (reinstalled only when the lock file changes; npm's cache keeps it quick).
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess

import jsonschema
import pytest

from .conftest import ROOT

NODE_DIR = ROOT / "tests" / "e2e" / "node"
STAMP = NODE_DIR / "node_modules" / ".ninfer-lock-sha256"
ITEM = {
    "type": "object",
    "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
        "qty": {"type": "integer", "minimum": 1, "maximum": 9},
        "tags": {"type": "array", "items": {"enum": ["new", "sale"]}, "maxItems": 2},
    },
    "required": ["sku", "qty"],
    "additionalProperties": False,
}

pytestmark = pytest.mark.skipif(shutil.which("node") is None or shutil.which("npm") is None,
                                reason="node/npm not installed: the Node client test needs Node.js >= 18")


@pytest.fixture(scope="module")
def node_client() -> None:
    """``npm ci`` the pinned client packages once per lock-file version."""
    lock = hashlib.sha256((NODE_DIR / "package-lock.json").read_bytes()).hexdigest()
    if not STAMP.exists() or STAMP.read_text() != lock:
        p = subprocess.run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
                           cwd=NODE_DIR, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, f"npm ci failed:\n{p.stdout}\n{p.stderr}"
        STAMP.write_text(lock)


def node(stack, job: dict) -> dict:
    p = subprocess.run(["node", str(NODE_DIR / "client.mjs"), str(ROOT / "proto"), stack.target, json.dumps(job)],
                       cwd=NODE_DIR, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"node client failed ({p.returncode}):\n{p.stderr}"
    return json.loads(p.stdout)


def chat(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}]}


@pytest.mark.parametrize("seed", [1, 2])
def test_node_client_generates_schema_valid_json(stack, node_client, seed: int) -> None:
    out = node(stack, {"op": "generate", "request": {
        "chat": chat("Give one inventory item as JSON."), "max_tokens": 96,
        "sampling": {"temperature": 0.9, "seed": seed}, "constraint": {"json_schema": json.dumps(ITEM)}}})
    assert out["ok"], out
    fin = out["finish"]
    assert fin["finish_reason"] == "FINISH_REASON_STOP", out
    jsonschema.validate(json.loads(out["text"]), ITEM)
    assert fin["constraint"]["complete"] and fin["constraint"]["terminated"], fin
    assert int(fin["usage"]["completion_tokens"]) >= out["num_messages"] - 1 > 0


def test_node_client_counts_tokens_like_the_python_client(stack, client, node_client) -> None:
    out = node(stack, {"op": "count_tokens", "request": {"chat": chat("How many tokens is this?")}})
    assert out["ok"], out
    expected = client.count_tokens(messages=chat("How many tokens is this?")["messages"])
    assert int(out["response"]["num_tokens"]) == expected.num_tokens > 0


def test_node_client_decodes_the_rich_error_trailer(stack, node_client) -> None:
    out = node(stack, {"op": "generate", "request": {"prompt": "hi", "max_tokens": 8,
                                                     "constraint": {"grammar": 'root ::= "a" (\n'}}})
    assert not out["ok"] and out["code"] == 3, out  # INVALID_ARGUMENT
    det = out["error_detail"]
    assert det is not None, f"no ninfer.v1.ErrorDetail in grpc-status-details-bin: {out}"
    assert det["code"] == "INVALID_ARGUMENT" and det["kind"] == "InvalidGrammar", det
    assert re.fullmatch(r"\d+:\d+", det["location"]), det
