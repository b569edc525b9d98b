"""Unit tests of the ``ninfer`` CLI (clients.cli.main called in-process)."""

from __future__ import annotations

import io
import json
import signal
import sys
import threading

import pytest

from clients import cli
from ninfer.v1 import generation_pb2 as pb

JSON_KEYS = {"text", "reasoning", "tool_calls", "finish_reason", "usage", "constraint", "error"}
USAGE_KEYS = {"prompt_tokens", "completion_tokens", "draft_tokens", "accepted_draft_tokens"}


def run(argv, stdin_text: str = ""):
    out, err = io.StringIO(), io.StringIO()
    rc = cli.main(argv, stdout=out, stderr=err, stdin=io.StringIO(stdin_text))
    return rc, out.getvalue(), err.getvalue()


def run_json(argv, stdin_text: str = ""):
    rc, out, err = run(argv + ["--format", "json"], stdin_text)
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out
    return rc, json.loads(lines[0]), err


def test_generate_text_streams(fake_server):
    rc, out, err = run(["generate", "hello", "--server", fake_server.target])
    assert rc == 0
    assert out == "Hello world\n"
    assert err == ""


def test_generate_json_shape_exact(fake_server):
    rc, obj, _ = run_json(["generate", "hello", "--json-object", "--server", fake_server.target])
    assert rc == 0
    assert set(obj) == JSON_KEYS
    assert obj["text"] == "Hello world"
    assert obj["finish_reason"] == "stop"
    assert obj["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "draft_tokens": 6, "accepted_draft_tokens": 2}
    c = obj["constraint"]
    assert {"kind", "complete", "terminated"} <= set(c) <= {"kind", "complete", "terminated", "cache", "prepare_seconds"}
    assert (c["kind"], c["complete"], c["terminated"]) == ("json_object", True, True)
    assert obj["error"] is None
    assert fake_server.servicer.requests[-1].constraint.WhichOneof("kind") == "json_object"


def test_generate_json_unconstrained_constraint_null(fake_server):
    rc, obj, _ = run_json(["generate", "hello", "--server", fake_server.target])
    assert rc == 0 and obj["constraint"] is None and set(obj["usage"]) == USAGE_KEYS


def test_length_exits_zero(fake_server):
    rc, obj, _ = run_json(["generate", "length", "--server", fake_server.target])
    assert rc == 0 and obj["finish_reason"] == "length"


@pytest.mark.parametrize("argv,stdin_text", [(["generate", "a\udcff"], ""), (["generate", "x", "--regex", "\udcff"], ""),
                                             (["generate", "x", "--choice", "\udcff"], ""),
                                             (["generate", "-"], "\udcff\udcfe")])
def test_undecodable_input_is_a_structured_error_not_a_traceback(argv, stdin_text):
    """Undecodable bytes in argv / stdin reach Python as lone surrogates; protobuf refuses them. The CLI
    answers InvalidRequest (exit 2) before any RPC (the target is unreachable on purpose)."""
    rc, out, err = run(argv + ["--server", "127.0.0.1:1"], stdin_text)
    assert rc == 2 and out == "" and err.startswith("error: InvalidRequest: text is not valid Unicode"), err
    assert "Traceback" not in err


def test_length_without_output_says_so_in_text_mode(fake_server):
    rc, out, err = run(["generate", "length-empty", "--server", fake_server.target])
    assert rc == 0 and out == "\n" and err.startswith("note: max_tokens was reached before any output"), (out, err)
    rc, out, err = run(["generate", "length", "--server", fake_server.target])
    assert rc == 0 and out == "Hello world\n" and "note:" not in err
    # a constrained output cut at max_tokens (the constraint is not complete) says so on stderr
    rc, out, err = run(["generate", "length", "--json-object", "--server", fake_server.target])
    assert rc == 0 and out == "Hello world\n" and "does not complete its constraint" in err, (out, err)


def test_options_are_forwarded(fake_server, tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text('{"type": "object"}')
    rc, obj, _ = run_json(
        [
            "generate", "hi", "--chat", "--system", "sys",
            "--json-schema-file", str(schema),
            "--max-tokens", "9", "--temperature", "0", "--top-p", "0.8", "--top-k", "5",
            "--min-p", "0.1", "--seed", "42", "--speculative", "ngram", "--num-draft-tokens", "3",
            "--server", fake_server.target,
        ]
    )
    assert rc == 0 and obj["constraint"]["kind"] == "json_schema"
    req = fake_server.servicer.requests[-1]
    assert [(m.role, m.content) for m in req.chat.messages] == [("system", "sys"), ("user", "hi")]
    assert req.constraint.json_schema == '{"type": "object"}'
    assert req.max_tokens == 9
    assert req.sampling.HasField("temperature") and req.sampling.temperature == 0.0
    assert req.sampling.top_k == 5 and req.sampling.seed == 42
    assert req.speculative.method == pb.SPECULATIVE_METHOD_NGRAM and req.speculative.num_draft_tokens == 3


def test_grammar_regex_choice_forwarded(fake_server, tmp_path):
    g = tmp_path / "g.gbnf"
    g.write_text('root ::= "yes" | "no"')
    assert run(["generate", "p", "--grammar-file", str(g), "--server", fake_server.target])[0] == 0
    assert fake_server.servicer.requests[-1].constraint.grammar == 'root ::= "yes" | "no"'
    assert run(["generate", "p", "--regex", "[0-9]+", "--server", fake_server.target])[0] == 0
    assert fake_server.servicer.requests[-1].constraint.regex == "[0-9]+"
    assert run(["generate", "p", "--choice", "a", "--choice", "b", "--server", fake_server.target])[0] == 0
    assert list(fake_server.servicer.requests[-1].constraint.choice.options) == ["a", "b"]


@pytest.mark.parametrize("argv", [["-"], []])
def test_prompt_from_stdin(fake_server, argv):
    rc, out, _ = run(["generate", *argv, "--server", fake_server.target], stdin_text="from stdin\n")
    assert rc == 0 and out == "Hello world\n"
    req = fake_server.servicer.requests[-1]
    assert req.WhichOneof("input") == "prompt" and req.prompt == "from stdin\n"


def test_rejected_request_text_mode(fake_server):
    rc, out, err = run(["generate", "x", "--regex", "(", "--server", fake_server.target])
    assert rc == 2
    assert out == ""
    assert err.strip() == "error: InvalidRegex at 1:2: unbalanced parenthesis"


def test_rejected_request_json_mode(fake_server):
    rc, obj, _ = run_json(["generate", "reject-grammar", "--server", fake_server.target])
    assert rc == 2
    assert set(obj) == JSON_KEYS
    assert obj["finish_reason"] == "error" and obj["text"] == "" and obj["constraint"] is None
    assert obj["error"] == {"code": "INVALID_ARGUMENT", "kind": "InvalidGrammar", "message": "expected '::='", "location": "1:7"}


def test_missing_schema_file_exit_2(fake_server, tmp_path):
    rc, obj, _ = run_json(["generate", "x", "--json-schema-file", str(tmp_path / "nope.json"), "--server", fake_server.target])
    assert rc == 2
    assert obj["error"]["kind"] == "InvalidRequest" and obj["error"]["code"] == "INVALID_ARGUMENT"
    rc, out, err = run(["generate", "x", "--grammar-file", str(tmp_path / "nope.gbnf")])
    assert rc == 2 and err.startswith("error: InvalidRequest: ")


def test_runtime_error_exit_1(fake_server):
    rc, obj, _ = run_json(["generate", "runtime-error", "--server", fake_server.target])
    assert rc == 1
    assert obj["text"] == "par" and obj["finish_reason"] == "error"
    assert obj["error"] == {"code": "INTERNAL", "kind": "IntegrityError", "message": "row mismatch", "location": ""}
    rc, out, err = run(["generate", "runtime-error", "--server", fake_server.target])
    assert rc == 1 and out == "par\n" and err.strip() == "error: IntegrityError: row mismatch"


def test_server_unreachable_exit_1(dead_target):
    rc, obj, _ = run_json(["generate", "hello", "--server", dead_target])
    assert rc == 1
    assert obj["finish_reason"] == "error" and obj["error"]["code"] == "UNAVAILABLE"
    rc, out, err = run(["generate", "hello", "--server", dead_target])
    assert rc == 1 and err.startswith("error: ")


def test_env_default_server(fake_server, monkeypatch):
    monkeypatch.setenv("NINFER_SERVER", fake_server.target)
    rc, out, _ = run(["generate", "hello"])
    assert rc == 0 and out == "Hello world\n"


@pytest.mark.parametrize(
    "extra",
    [
        ["--json-object", "--regex", "a"],
        ["--choice", "a", "--grammar-file", "g"],
        ["--json-schema-file", "s", "--json-object"],
        ["--speculative", "bogus"],
        ["--system", "s"],  # --system without --chat
        ["--timeout", "-5"],
        ["--timeout", "nan"],
    ],
)
def test_usage_errors_exit_2(extra, capsys):
    rc, out, err = run(["generate", "x", *extra])
    assert rc == 2
    assert "usage:" in capsys.readouterr().err


@pytest.mark.parametrize("flag,value", [("--max-tokens", "99999999999"), ("--seed", "99999999999999999999999"),
                                        ("--seed", "-1"), ("--top-k", "99999999999"),
                                        ("--num-draft-tokens", "99999999999")])
def test_out_of_range_integers_exit_2(flag, value):
    """Values the proto field cannot hold are a structured InvalidRequest, not a ValueError traceback."""
    rc, out, err = run(["generate", "x", flag, value, "--server", "127.0.0.1:1"])
    assert rc == 2 and err.startswith(f"error: InvalidRequest: {flag[2:].replace('-', '_')} must be "), err
    assert value in err


def test_no_command_exit_2(capsys):
    assert run([])[0] == 2


@pytest.fixture()
def sigint_raises():
    """Ctrl-C must raise KeyboardInterrupt in this test even where the runner was started with
    SIGINT ignored (background jobs of a non-interactive shell, as in CI): there
    ``_thread.interrupt_main`` would do nothing."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_cancel_with_ctrl_c(fake_server, sigint_raises):
    """A KeyboardInterrupt while streaming cancels the RPC: finish_reason
    "cancelled", exit 1, and the server sees the cancellation."""
    import _thread

    fake_server.servicer.cancelled.clear()

    class InterruptingOut(io.StringIO):
        fired = False

        def write(self, s):
            n = super().write(s)
            if not self.fired and "x" in s:
                self.fired = True
                threading.Timer(0.1, _thread.interrupt_main).start()
            return n

    out, err = InterruptingOut(), io.StringIO()
    rc = cli.main(["generate", "slow", "--server", fake_server.target], stdout=out, stderr=err, stdin=io.StringIO())
    assert rc == 1
    assert out.getvalue().startswith("x") and out.getvalue().endswith("\n")
    assert err.getvalue().strip() == "error: cancelled"
    assert fake_server.servicer.cancelled.wait(5)


def test_cancel_json_mode(fake_server, sigint_raises):
    import _thread

    fake_server.servicer.cancelled.clear()
    t = threading.Timer(0.3, _thread.interrupt_main)
    t.start()
    rc, obj, _ = run_json(["generate", "slow", "--server", fake_server.target])
    assert rc == 1
    assert obj["finish_reason"] == "cancelled" and obj["error"] is None and obj["text"].startswith("x")
    assert fake_server.servicer.cancelled.wait(5)


def test_count_tokens(fake_server):
    rc, out, _ = run(["count-tokens", "a b c", "--server", fake_server.target])
    assert rc == 0 and out.strip() == "3"
    rc, out, _ = run(["count-tokens", "--chat", "--server", fake_server.target, "--format", "json"], stdin_text="a b")
    assert rc == 0 and json.loads(out) == {"num_tokens": 4, "max_context_tokens": 2048}


def test_health(fake_server, dead_target):
    rc, out, _ = run(["health", "--server", fake_server.target])
    assert rc == 0 and out.strip() == "SERVING"
    rc, out, err = run(["health", "--server", dead_target, "--timeout", "2"])
    assert rc == 1 and err.startswith("error: ")


def test_python_dash_m_entry():
    import runpy

    with pytest.raises(SystemExit) as ei:
        sys_argv = sys.argv
        try:
            sys.argv = ["ninfer", "generate", "--regex", "a", "--choice", "b"]
            runpy.run_module("clients", run_name="__main__")
        finally:
            sys.argv = sys_argv
    assert ei.value.code == 2


# -- tools and thinking (issue 10) --------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    },
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},
]


def _tools_file(tmp_path, tools=TOOLS):
    f = tmp_path / "tools.json"
    f.write_text(json.dumps(tools))
    return str(f)


def test_tools_flags_reach_the_request(fake_server, tmp_path):
    rc, obj, _ = run_json(
        ["generate", "weather?", "--chat", "--tools-file", _tools_file(tmp_path), "--tool-choice", "lookup",
         "--thinking", "on", "--thinking-budget", "64", "--server", fake_server.target]
    )
    assert rc == 0, obj
    req = fake_server.servicer.requests[-1]
    assert [t.name for t in req.tools] == ["lookup", "search"]
    assert req.tools[0].strict and not req.tools[1].strict
    assert json.loads(req.tools[0].parameters_json)["required"] == ["city", "days"]
    assert req.tools[0].description == "weather"
    assert req.tool_choice.mode == pb.TOOL_CHOICE_MODE_REQUIRED
    assert list(req.tool_choice.allowed_names) == ["lookup"]
    assert req.tool_choice.HasField("parallel") and not req.tool_choice.parallel
    assert req.thinking.enabled and req.thinking.budget_tokens == 64
    assert set(obj) == JSON_KEYS
    assert obj["finish_reason"] == "tool_calls"
    assert obj["reasoning"] == "let me think"
    assert obj["tool_calls"] == [{"id": "call_0", "name": "lookup", "arguments_json": '{"city":"Paris"}'}]
    assert obj["text"] == ""  # tool-call wire text is not content


@pytest.mark.parametrize(
    "flag,mode",
    [("auto", pb.TOOL_CHOICE_MODE_AUTO), ("none", pb.TOOL_CHOICE_MODE_NONE), ("required", pb.TOOL_CHOICE_MODE_REQUIRED)],
)
def test_tool_choice_modes(fake_server, tmp_path, flag, mode):
    rc, obj, _ = run_json(
        ["generate", "x", "--chat", "--tools-file", _tools_file(tmp_path), "--tool-choice", flag,
         "--no-parallel-tool-calls", "--server", fake_server.target]
    )
    req = fake_server.servicer.requests[-1]
    assert rc == 0 and req.tool_choice.mode == mode and not req.tool_choice.allowed_names
    assert req.tool_choice.HasField("parallel") and req.tool_choice.parallel is False
    assert not req.HasField("thinking")


def test_tools_text_mode_prints_calls_and_reasoning_to_stderr(fake_server, tmp_path):
    rc, out, err = run(["generate", "x", "--chat", "--tools-file", _tools_file(tmp_path), "--thinking", "on",
                        "--server", fake_server.target])
    assert rc == 0
    assert out == '[tool_call] lookup {"city":"Paris"}\n\n'
    assert err == "let me think"


def test_tools_file_errors_are_rejections(tmp_path, dead_target):
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    rc, obj, _ = run_json(["generate", "x", "--chat", "--tools-file", str(bad), "--server", dead_target])
    assert rc == cli.EXIT_REJECTED and obj["error"]["kind"] == "InvalidRequest" and obj["error"]["location"] == "1:3"
    rc, obj, _ = run_json(["generate", "x", "--chat", "--tools-file", _tools_file(tmp_path, [{"type": "function",
                           "function": {"name": ""}}]), "--server", dead_target])
    assert rc == cli.EXIT_REJECTED and obj["error"]["location"] == "/tools/0/function/name"
    rc, obj, _ = run_json(["generate", "x", "--chat", "--tools-file", _tools_file(tmp_path, [{"type": "retrieval"}]),
                           "--server", dead_target])
    assert rc == cli.EXIT_REJECTED and obj["error"]["location"] == "/tools/0/type"


@pytest.mark.parametrize("flags", [["--tools-file", "x.json"], ["--thinking", "on"], ["--tool-choice", "auto"],
                                   ["--no-parallel-tool-calls"], ["--thinking-budget", "3"]])
def test_tool_and_thinking_flags_need_chat(flags, dead_target, capsys):
    rc, out, err = run(["generate", "x", *flags, "--server", dead_target])
    assert rc == cli.EXIT_REJECTED and "requires --chat" in capsys.readouterr().err
