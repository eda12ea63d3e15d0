"""`pageserve admin lora`: load and unload LoRA adapters at run time, through the gateway's admin routes.

    pageserve admin lora load NAME PATH [--base-model MODEL]    # PATH: a PEFT folder on the engines' host
    pageserve admin lora unload NAME [--base-model MODEL]

Unlike the rest of `pageserve admin` (Redis only), adapters live in the engines, so this calls the gateway
(`--gateway URL`, $PAGESERVE_GATEWAY_URL, default http://127.0.0.1:8000), which tells every engine serving
the base model (gateway/lora_admin.py). The admin token is read from $PAGESERVE_ADMIN_TOKEN only, never a
flag (a flag shows in `ps`), and never printed. Which tenants may use the adapter: `pageserve admin tenant
models NAME --allow ADAPTER`.

Exit status: 0 done, 1 refused (a bad adapter, an unknown name, a wrong token), 2 usage error,
3 the gateway unreachable or failing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import httpx

DEFAULT_GATEWAY_URL = "http://127.0.0.1:8000"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pageserve admin lora", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", default=None, help=f"gateway URL ($PAGESERVE_GATEWAY_URL, {DEFAULT_GATEWAY_URL})")
    parser.add_argument("--json", action="store_true", help="print the gateway's JSON answer")
    cmds = parser.add_subparsers(dest="cmd", required=True)
    p = cmds.add_parser("load", help="load (or reload, as a new load) an adapter on every engine of its base")
    p.add_argument("name")
    p.add_argument("path", help="the PEFT folder, as the engines' host sees it")
    p.add_argument("--base-model", default=None, help="needed only when the engines serve several base models")
    p = cmds.add_parser("unload", help="unload an adapter (requests already running finish on it)")
    p.add_argument("name")
    p.add_argument("--base-model", default=None)
    return parser


def _call(url: str, token: str, path: str, body: dict[str, str]) -> httpx.Response:
    # A load waits for the engines to read the folder: allow for a large adapter on a busy host.
    return httpx.post(url.rstrip("/") + path, json=body, headers={"Authorization": f"Bearer {token}"},
                      timeout=150.0)


def main(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    token = os.environ.get("PAGESERVE_ADMIN_TOKEN", "")
    if not token:
        print("pageserve admin lora: set PAGESERVE_ADMIN_TOKEN (the gateway's admin token)", file=sys.stderr)
        return 2
    url = args.gateway or os.environ.get("PAGESERVE_GATEWAY_URL") or DEFAULT_GATEWAY_URL
    body = {"lora_name": args.name}
    if args.cmd == "load":
        body["lora_path"] = args.path
    if args.base_model:
        body["base_model"] = args.base_model
    try:
        r = _call(url, token, f"/v1/{args.cmd}_lora_adapter", body)
    except httpx.HTTPError as exc:
        print(f"pageserve admin lora: cannot reach the gateway at {url}: {type(exc).__name__}", file=sys.stderr)
        return 3
    try:
        data = r.json()
    except ValueError:
        data = {"error": {"message": r.text[:500]}}
    if r.status_code != 200:
        print(f"pageserve admin lora: {r.status_code}: {data.get('error', {}).get('message', data)}", file=sys.stderr)
        return 1 if r.status_code < 500 else 3
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(f"adapter {data['lora_name']} {data['status']} on {data['engines']} engine(s) of {data['base_model']}")
    return 0
