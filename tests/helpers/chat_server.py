"""A real HTTP server on loopback that speaks OpenAI's chat-completions protocol (and
Anthropic's Messages API, at /v1/messages) and serves
scripted answers, one per request, per model name; it can also answer with faults.

    server = ChatServer({"coder": [Reply("..."), Status(429), Reply("...")], "judge": [...]})
    with server:   # serves on http://127.0.0.1:<port>/v1
        ...

Every request is logged (model, messages, what was served, when it came: time.monotonic()), so a test can check what the
client actually sent and how often it retried. Usage counts are whitespace-separated words.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    text: str
    delay_s: float = 0.0  # a delay past the client's time-out makes a time-out


@dataclass
class Status:
    code: int
    message: str = "scripted fault"
    retry_after: str | None = None


class ChatServer:
    """`respond(model, messages) -> Reply | Status | None`, when given, answers every request whose
    model has no script (answers that depend on the prompt, not on the order of requests)."""

    def __init__(self, script: dict[str, list], respond=None):
        self.script = {model: list(items) for model, items in script.items()}
        self.respond = respond
        self.log: list[dict] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                anthropic_api = self.path.rstrip("/").endswith("/v1/messages")
                if not anthropic_api and not self.path.rstrip("/").endswith("/chat/completions"):
                    return self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                model = body.get("model", "")
                with outer.lock:
                    queue = outer.script.get(model, [])
                    item = queue.pop(0) if queue else None
                    if item is None and model not in outer.script and outer.respond is not None:
                        item = outer.respond(model, body.get("messages", []))
                    outer.log.append(
                        {
                            "model": model,
                            "messages": body.get("messages", []),
                            "t": time.monotonic(),
                            "served": type(item).__name__ if item else None,
                            "auth": self.headers.get("authorization"),
                        }
                    )
                if item is None:
                    return self._send(
                        400, {"error": {"message": f"script for {model!r} is used up", "type": "invalid_request_error"}}
                    )
                if isinstance(item, Status):
                    headers = {"retry-after": item.retry_after} if item.retry_after else {}
                    return self._send(item.code, {"error": {"message": item.message, "type": "scripted"}}, headers)
                if item.delay_s:
                    time.sleep(item.delay_s)
                prompt_words = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
                answer_words = len(item.text.split())
                if anthropic_api:  # Anthropic's Messages API
                    return self._send(
                        200,
                        {
                            "id": f"msg_{len(outer.log)}",
                            "type": "message",
                            "role": "assistant",
                            "model": model,
                            "content": [{"type": "text", "text": item.text}],
                            "stop_reason": "end_turn",
                            "stop_sequence": None,
                            "usage": {"input_tokens": prompt_words, "output_tokens": answer_words},
                        },
                    )
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{len(outer.log)}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": model,
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": item.text},
                            }
                        ],
                        "usage": {
                            "prompt_tokens": prompt_words,
                            "completion_tokens": answer_words,
                            "total_tokens": prompt_words + answer_words,
                        },
                    },
                )

            def _send(self, code, payload, headers=None):
                data = json.dumps(payload).encode()
                try:
                    self.send_response(code)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a scripted time-out)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        """OpenAI-style base URL; the Anthropic client takes the root (`root_url`)."""
        return f"{self.root_url}/v1"

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def served(self, model: str) -> list[str | None]:
        return [e["served"] for e in self.log if e["model"] == model]

    def prompts(self, model: str) -> list[str]:
        """The user message of every request for `model` that was answered with a Reply."""
        return [e["messages"][-1]["content"] for e in self.log if e["model"] == model and e["served"] == "Reply"]

    def __enter__(self) -> ChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
