"""The ``ninfer`` command line.

Subcommands::

    ninfer generate [PROMPT]   generate text (optionally constrained), streaming
    ninfer count-tokens [PROMPT]
    ninfer health

Exit codes: 0 success; 2 rejected request (bad arguments, or the server
refused the request before queueing); 1 any other failure (server
unreachable, runtime error, cancellation).

Server-side subcommands (``ninfer serve``) are not here: the ``ninfer`` console
script is :mod:`ninfer_cli`, which dispatches them and hands every other
command to :func:`main`. This module imports only the client library.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Mapping, Sequence, TextIO

from .client import GenerationResult, NInferClient, default_target
from .errors import NInferError, RequestRejected, format_error

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_REJECTED = 2

_SPEC_CHOICES = ["none", "ngram", "early-exit", "early-exit-sampled"]


def _seconds(text: str) -> float:
    """argparse type of ``--timeout``: a finite number of seconds > 0 (else a usage error, exit 2)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return v


def _add_server(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--server",
        default=None,
        metavar="HOST:PORT",
        help="server address (default: $NINFER_SERVER or 127.0.0.1:50051)",
    )
    p.add_argument("--timeout", type=_seconds, default=None, metavar="S", help="deadline in seconds")


def _add_input(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", nargs="?", default=None, metavar="PROMPT", help="prompt text; '-' or omitted reads stdin")
    p.add_argument("--chat", action="store_true", help="send PROMPT as a user message through the chat template")
    p.add_argument("--system", default=None, metavar="TEXT", help="system message (with --chat)")


def build_parser(extra_commands: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """Builds the ``ninfer`` argument parser.

    Args:
        extra_commands: ``{name: help}`` of subcommands another dispatcher runs
            (``serve``); listed in ``--help`` only.
    """
    parser = argparse.ArgumentParser(prog="ninfer", description="NInfer: LLM serving with grammar-constrained decoding")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    for name, help_text in (extra_commands or {}).items():
        sub.add_parser(name, help=help_text, add_help=False)

    g = sub.add_parser("generate", help="generate text")
    _add_input(g)
    body = g.add_mutually_exclusive_group()
    body.add_argument("--json-object", action="store_true", help="constrain the output to a JSON object")
    body.add_argument("--json-schema-file", metavar="F", help="constrain the output to a JSON Schema (file)")
    body.add_argument("--grammar-file", metavar="F", help="constrain the output to a GBNF grammar (file, rule root)")
    body.add_argument("--regex", metavar="R", help="constrain the output to a regular expression")
    body.add_argument("--choice", metavar="C", action="append", help="allowed output (repeatable)")
    g.add_argument("--max-tokens", type=int, default=None, metavar="N")
    g.add_argument("--temperature", type=float, default=None, metavar="T")
    g.add_argument("--top-p", type=float, default=None, metavar="P")
    g.add_argument("--top-k", type=int, default=None, metavar="K")
    g.add_argument("--min-p", type=float, default=None, metavar="P")
    g.add_argument("--seed", type=int, default=None, metavar="N")
    g.add_argument("--presence-penalty", type=float, default=None, metavar="X")
    g.add_argument("--frequency-penalty", type=float, default=None, metavar="X")
    g.add_argument("--speculative", choices=_SPEC_CHOICES, default=None)
    g.add_argument("--num-draft-tokens", type=int, default=None, metavar="K")
    g.add_argument("--tools-file", metavar="F", help="JSON list of OpenAI-style function tools (with --chat)")
    g.add_argument(
        "--tool-choice",
        default=None,
        metavar="auto|none|required|NAME",
        help="tool call policy (default auto; NAME = call exactly that tool once)",
    )
    g.add_argument("--no-parallel-tool-calls", action="store_true", help="at most one tool call in the turn")
    g.add_argument("--thinking", choices=["on", "off"], default=None, help="reasoning stage on/off (default: the model's)")
    g.add_argument("--thinking-budget", type=int, default=None, metavar="N", help="reasoning token budget; the close is forced after N")
    g.add_argument(
        "--format",
        choices=["text", "json"],
        default="text",
        help="output format (default text); json adds reasoning and tool_calls",
    )
    _add_server(g)

    c = sub.add_parser("count-tokens", help="count the tokens of a prompt")
    _add_input(c)
    c.add_argument("--format", choices=["text", "json"], default="text")
    _add_server(c)

    h = sub.add_parser("health", help="check server health (grpc.health.v1)")
    h.add_argument("--service", default="", help="service name (default: the whole server)")
    _add_server(h)
    return parser


def _read_prompt(args: argparse.Namespace, stdin: TextIO) -> str:
    if args.prompt is None or args.prompt == "-":
        return stdin.read()
    return args.prompt


def _input_kwargs(args: argparse.Namespace, stdin: TextIO) -> dict[str, Any]:
    text = _read_prompt(args, stdin)
    if args.chat:
        messages = []
        if args.system is not None:
            messages.append({"role": "system", "content": args.system})
        messages.append({"role": "user", "content": text})
        return {"messages": messages}
    return {"prompt": text}


def _read_file(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise RequestRejected("INVALID_ARGUMENT", "InvalidRequest", f"cannot read {what} file {path!r}: {e}", "") from None


def _constraint(args: argparse.Namespace) -> dict | None:
    if args.json_object:
        return {"json_object": True}
    if args.json_schema_file is not None:
        return {"json_schema": _read_file(args.json_schema_file, "JSON Schema")}
    if args.grammar_file is not None:
        return {"grammar": _read_file(args.grammar_file, "grammar")}
    if args.regex is not None:
        return {"regex": args.regex}
    if args.choice is not None:
        return {"choice": list(args.choice)}
    return None


def _tools(args: argparse.Namespace) -> list | None:
    """Reads ``--tools-file``: a JSON list of OpenAI-style function tools."""
    if args.tools_file is None:
        return None
    text = _read_file(args.tools_file, "tools")
    try:
        tools = json.loads(text)
    except json.JSONDecodeError as e:
        raise RequestRejected(
            "INVALID_ARGUMENT", "InvalidRequest", f"tools file {args.tools_file!r} is not JSON: {e}", f"{e.lineno}:{e.colno}"
        ) from None
    if isinstance(tools, dict) and "tools" in tools:
        tools = tools["tools"]
    if not isinstance(tools, list):
        raise RequestRejected("INVALID_ARGUMENT", "InvalidRequest", f"tools file {args.tools_file!r} must hold a JSON list", "")
    return tools


def _exit_for(result: GenerationResult) -> int:
    return EXIT_OK if result.ok else EXIT_FAILURE


def _error_result(exc: NInferError, text: str = "") -> GenerationResult:
    return GenerationResult(text=text, finish_reason="error", error=exc.to_dict())


def _exit_for_exc(exc: NInferError) -> int:
    return EXIT_REJECTED if isinstance(exc, RequestRejected) else EXIT_FAILURE


def _cmd_generate(args: argparse.Namespace, out: TextIO, err: TextIO, stdin: TextIO) -> int:
    as_json = args.format == "json"

    def fail(exc: NInferError, text: str = "") -> int:
        if as_json:
            print(json.dumps(_error_result(exc, text).to_dict(), ensure_ascii=False), file=out, flush=True)
        else:
            if text:
                print(file=out, flush=True)
            print(f"error: {format_error(exc.to_dict())}", file=err, flush=True)
        return _exit_for_exc(exc)

    try:
        kwargs = _input_kwargs(args, stdin)
        kwargs.update(
            constraint=_constraint(args),
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p,
            seed=args.seed,
            presence_penalty=args.presence_penalty,
            frequency_penalty=args.frequency_penalty,
            speculative=args.speculative,
            num_draft_tokens=args.num_draft_tokens,
            tools=_tools(args),
            tool_choice=args.tool_choice,
            parallel_tool_calls=False if args.no_parallel_tool_calls else None,
            thinking=args.thinking,
            thinking_budget=args.thinking_budget,
        )
    except NInferError as exc:
        return fail(exc)

    with NInferClient(args.server or default_target(), timeout_s=args.timeout) as client:
        stream = None
        try:
            stream = client.generate(**kwargs)
            for event in stream:
                if not as_json:
                    _print_event(event, out, err)
            result = stream.result
            assert result is not None
        except NInferError as exc:
            return fail(exc, stream.text if stream is not None else "")
        except KeyboardInterrupt:
            if stream is None:
                return EXIT_FAILURE
            result = stream.cancel()

    if as_json:
        print(json.dumps(result.to_dict(), ensure_ascii=False), file=out, flush=True)
    else:
        print(file=out, flush=True)
        if result.finish_reason == "error" and result.error is not None:
            print(f"error: {format_error(result.error)}", file=err, flush=True)
        elif result.finish_reason == "cancelled":
            print("error: cancelled", file=err, flush=True)
        elif result.finish_reason == "length" and not result.text and not result.tool_calls:
            print("note: max_tokens was reached before any output (an unfinished tool call is not printed; "
                  "raise --max-tokens)", file=err, flush=True)
        elif result.finish_reason == "length" and result.constraint and not result.constraint.get("complete"):
            print("note: max_tokens was reached: the output is cut short and does not complete its constraint "
                  "(raise --max-tokens)", file=err, flush=True)
    return _exit_for(result)


def _print_event(event: Any, out: TextIO, err: TextIO) -> None:
    """Text mode: content to stdout; reasoning to stderr; each completed tool
    call as one ``[tool_call] NAME ARGUMENTS_JSON`` line on stdout."""
    if event.channel == "reasoning":
        if event.text:
            err.write(event.text)
            err.flush()
    elif event.channel == "content":
        if event.text:
            out.write(event.text)
            out.flush()
    if event.tool_call is not None:
        out.write(f"[tool_call] {event.tool_call['name']} {event.tool_call['arguments_json']}\n")
        out.flush()


def _cmd_count_tokens(args: argparse.Namespace, out: TextIO, err: TextIO, stdin: TextIO) -> int:
    try:
        kwargs = _input_kwargs(args, stdin)
        with NInferClient(args.server or default_target(), timeout_s=args.timeout) as client:
            count = client.count_tokens(**kwargs)
    except NInferError as exc:
        if args.format == "json":
            print(json.dumps({"error": exc.to_dict()}), file=out)
        else:
            print(f"error: {format_error(exc.to_dict())}", file=err)
        return _exit_for_exc(exc)
    if args.format == "json":
        print(json.dumps({"num_tokens": count.num_tokens, "max_context_tokens": count.max_context_tokens}), file=out)
    else:
        print(count.num_tokens, file=out)
    return EXIT_OK


def _cmd_health(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    timeout = args.timeout if args.timeout is not None else 5.0
    try:
        with NInferClient(args.server or default_target(), timeout_s=timeout) as client:
            status = client.health(args.service)
    except NInferError as exc:
        print(f"error: {format_error(exc.to_dict())}", file=err)
        return EXIT_FAILURE
    print(status, file=out)
    return EXIT_OK if status == "SERVING" else EXIT_FAILURE


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    stdin: TextIO | None = None,
    extra_commands: Mapping[str, str] | None = None,
) -> int:
    """Runs the client commands of the ``ninfer`` CLI.

    Args:
        argv: arguments without the program name (default ``sys.argv[1:]``).
        stdout, stderr, stdin: streams (default the ``sys`` ones, looked up at call time).
        extra_commands: ``{name: help}`` of commands dispatched elsewhere, for ``--help``.
    Returns:
        The exit code: 0 success, 2 rejected request / usage error,
        1 other failure.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    inp = stdin if stdin is not None else sys.stdin

    parser = build_parser(extra_commands)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # usage errors (2) and --help (0)
        return int(e.code) if isinstance(e.code, int) else EXIT_REJECTED
    needs_chat = [
        flag
        for flag, attr in (("--system", "system"), ("--tools-file", "tools_file"), ("--tool-choice", "tool_choice"),
                           ("--thinking", "thinking"), ("--thinking-budget", "thinking_budget"))
        if getattr(args, attr, None) is not None
    ]
    if getattr(args, "no_parallel_tool_calls", False):
        needs_chat.append("--no-parallel-tool-calls")
    if needs_chat and not getattr(args, "chat", False):
        try:
            parser.error(f"{needs_chat[0]} requires --chat")
        except SystemExit as e:
            return int(e.code) if isinstance(e.code, int) else EXIT_REJECTED

    if args.command == "generate":
        return _cmd_generate(args, out, err, inp)
    if args.command == "count-tokens":
        return _cmd_count_tokens(args, out, err, inp)
    if args.command == "health":
        return _cmd_health(args, out, err)
    parser.print_help(err)
    return EXIT_REJECTED


__all__ = ["EXIT_FAILURE", "EXIT_OK", "EXIT_REJECTED", "build_parser", "main"]
