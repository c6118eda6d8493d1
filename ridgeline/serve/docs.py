"""GET /docs: the API as one self-contained HTML page, rendered on the server from the OpenAPI schema.
No script and no stylesheet from a CDN (FastAPI's default Swagger page loads both): it works offline."""
from __future__ import annotations

import html
import json

from fastapi.responses import HTMLResponse

_STYLE = ("body{font:15px/1.45 system-ui,sans-serif;max-width:960px;margin:2em auto;padding:0 1em}"
          "code{background:#f3f3f3;padding:.1em .3em}td{padding:.2em .8em .2em 0;vertical-align:top}"
          "pre{background:#f6f6f6;padding:1em;overflow:auto;font-size:12px}")


def docs_page(schema: dict) -> HTMLResponse:
    info = schema.get("info", {})
    title = html.escape(f"{info.get('title', 'API')} {info.get('version', '')}".strip())
    rows = []
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            rows.append(f"<tr><td><code>{html.escape(method.upper())}</code></td><td><code>{html.escape(path)}"
                        f"</code></td><td>{html.escape(op.get('summary', ''))}</td></tr>")
    full = html.escape(json.dumps(schema, indent=2))
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{_STYLE}</style>"
            f"</head><body><h1>{title}</h1><p>OpenAI-compatible routes. The machine-readable schema is at "
            f"<a href='openapi.json'>openapi.json</a>.</p><table>{''.join(rows)}</table>"
            f"<details><summary>OpenAPI schema</summary><pre>{full}</pre></details></body></html>")
    return HTMLResponse(page)
