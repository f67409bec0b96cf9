"""The VM test's forge: accounts on the test PDS and the knotless records
of docs/design/protocol.md (a repository, its pushes, the runner's checks).

  forge.py account HANDLE                     -> "DID APP_PASSWORD"
  forge.py repo DID PASSWORD NAME SOURCE RUNNER -> the repo record's AT-URI
  forge.py push DID PASSWORD REPO_URI OLD NEW -> the refUpdate's AT-URI
  forge.py check RUNNER EVENT_URI             -> latest check status, or "none"
  forge.py checks RUNNER EVENT_URI            -> how many checks name the event
"""

import base64
import json
import sys
import urllib.parse
import urllib.request
from datetime import datetime, timezone

PDS = "http://localhost:3000"
ADMIN = ("admin", "vm-test-admin-password")
PASSWORD = "vm-test-password"


def xrpc(method, params=None, body=None, token=None, basic=None):
    url = f"{PDS}/xrpc/{method}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if basic:
        req.add_header("Authorization", "Basic " + base64.b64encode(":".join(basic).encode()).decode())
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"{}")


def now():
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def session(did, password):
    return xrpc("com.atproto.server.createSession", body={"identifier": did, "password": password})["accessJwt"]


def put(did, password, collection, rkey, record):
    out = xrpc(
        "com.atproto.repo.putRecord" if rkey else "com.atproto.repo.createRecord",
        body={"repo": did, "collection": collection, "validate": False, "record": {"$type": collection, **record}}
        | ({"rkey": rkey} if rkey else {}),
        token=session(did, password),
    )
    return out["uri"]


def account(handle):
    code = xrpc("com.atproto.server.createInviteCode", body={"useCount": 1}, basic=ADMIN)["code"]
    acct = xrpc(
        "com.atproto.server.createAccount",
        body={"handle": handle, "email": f"{handle}@example.com", "password": PASSWORD, "inviteCode": code},
    )
    pw = xrpc("com.atproto.server.createAppPassword", body={"name": "knotless-vm-test"}, token=acct["accessJwt"])
    return f"{acct['did']} {pw['password']}"


def checks(runner, event):
    out, cursor = [], None
    while True:
        params = {"repo": runner, "collection": "dev.knotless.check", "limit": 100}
        if cursor:
            params["cursor"] = cursor
        page = xrpc("com.atproto.repo.listRecords", params)
        out += [r["value"] for r in page["records"] if r["value"].get("subject", {}).get("event") == event]
        cursor = page.get("cursor")
        if not cursor or not page["records"]:
            return out


def main(cmd, *args):
    if cmd == "account":
        return account(*args)
    if cmd == "repo":
        did, password, name, source, runner = args
        return put(
            did,
            password,
            "dev.knotless.repo",
            name,
            {"name": name, "source": source, "defaultBranch": "main", "runners": [runner], "createdAt": now()},
        )
    if cmd == "push":
        did, password, repo, old, new = args
        return put(
            did,
            password,
            "dev.knotless.refUpdate",
            None,
            {"repo": repo, "ref": "refs/heads/main", "old": old, "new": new, "createdAt": now()},
        )
    if cmd == "check":
        found = checks(*args)
        return found[-1].get("status", "unknown") if found else "none"
    if cmd == "checks":
        return str(len(checks(*args)))
    sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    print(main(*sys.argv[1:]))
