"""A scripted model on loopback: an OpenAI-compatible chat completions
endpoint that answers kforge's prompts with real source edits of the kernel
it was shown, in a fixed rotation, so the whole model loop (server, worker,
store) can be driven without a model.

Fresh proposals (the prompt has "## Parent <name>") rotate through:
  knob    SEARCH/REPLACE edits of the parent's knob prelude (a smaller
          KF_BLOCK_N)
  broken  the whole parent plus a function using an undefined name: the
          worker's NVRTC refuses it; the repair removes the line
  comment the parent with comments and whitespace added: a duplicate that
          must never be compiled
  include "#include <stdio.h>" on top: refused by the static checks before
          any compile; the repair removes it
  scale   a semantic bug (the softmax scale halved): compiles, and is wrong
          on a GPU; the repair restores the scale
Every answer that is meant to be new carries a function kf_idea_<n>, so
no two ideas are duplicates of each other.

Repairs (the prompt has "## Your variant <name> failed") are answered with
edits of the failing source named in the prompt, undoing whatever the
rotation broke.

Every request is kept (its JSON body), and the first request of each test
can be told to answer with HTTP 400 refusing "max_tokens" (as reasoning
models do) to check the client learns max_completion_tokens.

Usage as a module: ScriptedModel(delay_s=0.2).start() -> base_url; .stop().
"""
import http.server
import json
import re
import threading
import time

ROTATION = ("knob", "broken", "comment", "include", "scale")


def _tokens(text):
    return max(1, len(text) // 4)


def _parent(prompt):
    m = re.search(r"^## Parent (\S+?):", prompt, re.M)
    if not m:
        return None, None
    rest = prompt[m.end():]
    src = re.search(r"```cuda\n(.*?)\n```\n```json", rest, re.S)
    return m.group(1), src.group(1) if src else None


def _failed(prompt):
    m = re.search(r"^## Your variant (\S+) failed: (.*)$", prompt, re.M)
    if not m:
        return None, None, None
    handle = m.group(1)
    src = re.search(r"## The source of " + re.escape(handle) + r", as compiled\n```cuda\n(.*?)\n```\n```json",
                    prompt, re.S)
    return handle, m.group(2), src.group(1) if src else None


def _edit(parent, pairs, why):
    out = [why, "parent: " + parent]
    for search, replace in pairs:
        out += ["<<<<<<< SEARCH", search.rstrip("\n"), "=======", replace.rstrip("\n"), ">>>>>>> REPLACE"]
    return "\n".join(out) + "\n"


def _whole(source, manifest, why):
    return "%s\n```cuda\n%s\n```\n```json\n%s\n```\n" % (why, source, manifest)


def _manifest(prompt):
    m = re.search(r"```json\n(.*?)\n```", prompt, re.S)
    return m.group(1) if m else "{}"


class ScriptedModel:
    def __init__(self, delay_s=0.0, refuse_max_tokens_first=True):
        self.delay_s = delay_s
        self.refuse_max_tokens = refuse_max_tokens_first
        self.requests = []      # request bodies (dicts), in arrival order
        self.answers = []       # (kind, action, answer text)
        self.fresh = 0
        self.lock = threading.Lock()
        self.httpd = None

    # ------------------------------------------------------------ answers
    def answer(self, body):
        prompt = body["messages"][-1]["content"]
        handle, failure, failing = _failed(prompt)
        if handle:
            return "repair", self.repair(handle, failing, prompt)
        parent, source = _parent(prompt)
        if not parent or source is None:
            return "none", "I have nothing to offer."
        with self.lock:
            n = self.fresh
            self.fresh += 1
        action = ROTATION[n % len(ROTATION)]
        idea = "__device__ int kf_idea_%d() { return %d; }" % (n, n)
        manifest = _manifest(prompt[prompt.index("## Parent"):])
        if action == "knob":
            m = re.search(r"(// kforge knobs\n(?:#define KF_\w+ \d+\n)*?#define KF_BLOCK_N )(\d+)\n", source)
            if m:
                old = m.group(0)
                value = int(m.group(2))
                new_value = value // 2 if value >= 64 else value + 32
                new = m.group(1) + str(new_value) + "\n" + idea + "\n"
                return action, _edit(parent, [(old, new)], "Smaller key blocks (BLOCK_N %d -> %d)." % (value, new_value))
            return action, _whole(source + "\n" + idea + "\n", manifest, "A new helper.")
        if action == "broken":
            return action, _whole(source + "\n" + idea + "\n__device__ int kf_broken_%d() { return undefined_symbol_%d; }\n"
                                  % (n, n), manifest, "Added a helper for the epilogue.")
        if action == "comment":
            return action, _whole("// A cleaner version of the kernel.\n\n" + source.replace("\n", "\n\n", 3),
                                  manifest, "Only tidied it up.")
        if action == "include":
            return action, _whole("#include <stdio.h>\n" + source + "\n" + idea + "\n", manifest,
                                  "Added debugging support.")
        # scale: a semantic bug that compiles
        if "p.softmax_scale_log2" in source:
            bad = source.replace("p.softmax_scale_log2", "(p.softmax_scale_log2 * 0.5f)", 1)
        else:
            bad = source
        return action, _whole(bad + "\n" + idea + "\n", manifest, "Folded the scale.")

    def repair(self, handle, failing, prompt):
        if failing is None:
            return "No source was shown to fix."
        pairs = []
        for line in failing.split("\n"):
            if "undefined_symbol_" in line or line.startswith("#include <stdio.h>"):
                pairs.append((line + "\n", ""))
        if "(p.softmax_scale_log2 * 0.5f)" in failing:
            pairs.append(("(p.softmax_scale_log2 * 0.5f)", "p.softmax_scale_log2"))
        if not pairs:
            return "I do not see what is wrong with " + handle + "."
        # An edit of the scale sits inside a longer line: search for the line.
        fixed = []
        for search, replace in pairs:
            if "\n" in search:
                fixed.append((search, replace))
                continue
            line = next(l for l in failing.split("\n") if search in l)
            fixed.append((line + "\n", line.replace(search, replace) + "\n"))
        return _edit(handle, fixed, "Fixed it: removed what broke " + handle + ".")

    # --------------------------------------------------------------- http
    def start(self):
        model = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                with model.lock:
                    model.requests.append(body)
                    refuse = model.refuse_max_tokens and "max_tokens" in body
                    if refuse:
                        model.refuse_max_tokens = False
                if refuse:
                    self.send(400, {"error": {"message": "Unsupported parameter: 'max_tokens' is not supported "
                                                         "with this model. Use 'max_completion_tokens' instead.",
                                              "type": "invalid_request_error", "param": "max_tokens",
                                              "code": "unsupported_parameter"}})
                    return
                if model.delay_s:
                    time.sleep(model.delay_s)
                kind, text = model.answer(body)
                # As an endpoint does: an answer stops at the request's limit
                # (a whole source is about 5,600 tokens; the proposer sizes
                # a request down to the spend left), cut off with
                # finish_reason "length", so spend never passes a reservation.
                limit = body.get("max_completion_tokens", body.get("max_tokens"))
                finish = "stop"
                if isinstance(limit, int) and _tokens(text) > limit:
                    text, finish = text[:4 * limit], "length"
                with model.lock:
                    model.answers.append((kind, text))
                prompt = "".join(m["content"] for m in body["messages"])
                self.send(200, {"id": "chatcmpl-scripted", "object": "chat.completion", "model": "scripted",
                                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                             "finish_reason": finish}],
                                "usage": {"prompt_tokens": _tokens(prompt), "completion_tokens": _tokens(text),
                                          "total_tokens": _tokens(prompt) + _tokens(text)}})

            def send(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except BrokenPipeError:
                    pass  # the server was killed while it waited: the test does that

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return "http://127.0.0.1:%d/v1" % self.httpd.server_address[1]

    def stop(self):
        if self.httpd:
            self.httpd.shutdown()
            self.httpd.server_close()
