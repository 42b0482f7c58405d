"""An OpenAI-compatible server on loopback answering from a real model in this process (the hf backend):
the wire format vLLM speaks (token-id prompts, `return_token_ids`, `logprob_token_ids` answered as
"token_id:N" keys), so `backend=openai` can be held to the same numbers as `backend=hf`."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fairaudit.backends import Backend, GenerationRequest


class LoopbackServer:
    """An HTTP server on 127.0.0.1, serving `handler` from a daemon thread at `url` (…/v1) until `stop()`."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        # shutdown() waits for serve_forever's next poll: every 0.05 s, not Python's default 0.5 s
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class ModelServer(LoopbackServer):
    """Serves model "local" from `backend` (one holding a transformers model as `.model`, with its `stop_ids`);
    one request computes at a time."""

    def __init__(self, backend: Backend):
        self.backend = backend
        super().__init__(self._handler())

    def logprobs(self, prompt: list[int], token_ids: list[int]) -> dict[str, float]:
        """Log-probabilities of `token_ids` at the position after the prompt, keyed as vLLM keys them."""
        import torch

        model = self.backend.model
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([prompt], device=model.device)).logits[0, -1]
            values = torch.log_softmax(logits.double(), -1)[token_ids].tolist()
        return {f"token_id:{t}": v for t, v in zip(token_ids, values)}

    def completion(self, body: dict) -> dict:
        prompt = list(body["prompt"])
        with self.lock:
            if "logprob_token_ids" in body:
                top = self.logprobs(prompt, list(body["logprob_token_ids"]))
                return {"choices": [{"text": "", "finish_reason": "length", "logprobs": {"top_logprobs": [top]}}]}
            request = GenerationRequest(tuple(prompt), body["max_tokens"], body.get("temperature", 0.0),
                                        body.get("top_p", 1.0), body.get("seed"))
            done = self.backend.generate([request])[0]
        eos = [min(self.backend.stop_ids)] if done.finish_reason == "stop" else []  # vLLM returns the stop token
        return {"choices": [{"text": "", "token_ids": list(done.token_ids) + eos, "finish_reason": done.finish_reason}]}

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send({"data": [{"id": "local"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._send(server.completion(body))

        return Handler
