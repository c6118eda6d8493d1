"""Prefill/decode disaggregation: KV connectors (connector.py, transports.py), the prefill engine's
export (export.py) and the decode engine's adoption (adopt.py) of a request's prompt KV, worker roles
(worker.py) and the xPyD front (front.py, launch.py). See docs/design/."""
