"""A webhook that admits everything unchanged: the floor any HTTPS webhook on this machine pays.

`python -m benchmarks.null_webhook PORT CERT KEY` serves POST /mutate-virtualmachineinstances over
TLS with aiohttp, as licensectl's listener does, but decides nothing. The admission benchmark runs it
as its own process, so the difference between it and licensectl is licensectl's own cost.
"""

from __future__ import annotations

import json
import ssl
import sys

from aiohttp import web

from licensectl.serve.webhook import PATH


async def admit(request: web.Request) -> web.Response:
    review = await request.json()
    return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                              "response": {"uid": review["request"]["uid"], "allowed": True}},
                             dumps=json.dumps)


def main(argv: list[str]) -> None:
    port, cert, key = int(argv[0]), argv[1], argv[2]
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    app = web.Application()
    app.router.add_post(PATH, admit)
    web.run_app(app, host="127.0.0.1", port=port, ssl_context=ctx, access_log=None, print=None)


if __name__ == "__main__":
    main(sys.argv[1:])
