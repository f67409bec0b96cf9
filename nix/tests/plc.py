"""A DID PLC directory for the VM test, in memory and without checks.

It stores the operations a PDS submits and serves the DID documents the
runner resolves. It verifies no signature: the test needs a directory, not
a trustworthy one. Listens on 127.0.0.1:2582.
"""

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

ops = {}  # did -> list of operations, oldest first


def data(did):
    op = ops[did][-1]
    if "verificationMethods" not in op:  # legacy genesis shape
        op = {
            "rotationKeys": [op["recoveryKey"], op["signingKey"]],
            "verificationMethods": {"atproto": op["signingKey"]},
            "alsoKnownAs": ["at://" + op["handle"]],
            "services": {"atproto_pds": {"type": "AtprotoPersonalDataServer", "endpoint": op["service"]}},
        }
    return {
        "did": did,
        "rotationKeys": op["rotationKeys"],
        "verificationMethods": op["verificationMethods"],
        "alsoKnownAs": op["alsoKnownAs"],
        "services": op["services"],
    }


def document(did):
    d = data(did)
    return {
        "@context": ["https://www.w3.org/ns/did/v1", "https://w3id.org/security/multikey/v1"],
        "id": did,
        "alsoKnownAs": d["alsoKnownAs"],
        "verificationMethod": [
            {"id": f"{did}#{k}", "type": "Multikey", "controller": did, "publicKeyMultibase": v.removeprefix("did:key:")}
            for k, v in d["verificationMethods"].items()
        ],
        "service": [
            {"id": f"#{k}", "type": v["type"], "serviceEndpoint": v["endpoint"]} for k, v in d["services"].items()
        ],
    }


def path_parts(path):
    # The PDS posts to /did%3Aplc%3A... (the DID percent-encoded, as
    # @did-plc/lib's client writes it) while a resolver GETs /did:plc:...:
    # both name the same DID.
    return [unquote(p) for p in path.split("?", 1)[0].strip("/").split("/")]


class Handler(BaseHTTPRequestHandler):
    def reply(self, code, body):
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        parts = path_parts(self.path)
        if parts == ["_health"]:
            return self.reply(200, {"version": "knotless-vm-test"})
        did = parts[0]
        if did not in ops:
            return self.reply(404, {"message": f"DID not registered: {did}"})
        rest = parts[1:]
        if rest == []:
            return self.reply(200, document(did))
        if rest == ["data"]:
            return self.reply(200, data(did))
        if rest == ["log"]:
            return self.reply(200, ops[did])
        if rest == ["log", "last"]:
            return self.reply(200, ops[did][-1])
        if rest == ["log", "audit"]:
            return self.reply(200, [{"did": did, "operation": op, "nullified": False} for op in ops[did]])
        return self.reply(404, {"message": "not found"})

    def do_POST(self):
        did = path_parts(self.path)[0]
        op = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ops.setdefault(did, []).append(op)
        self.reply(200, {})


ThreadingHTTPServer(("127.0.0.1", 2582), Handler).serve_forever()
