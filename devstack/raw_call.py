"""``devstack/mcp_upstream.py``'s ``count`` tool called without the SDK: the JSON-RPC request and
the headers a resume route's client posts raw, as the resume tests
(``tests/integration/resume_support.py``) and ``loadtest.resume_cost`` do. Plain values, so
that a benchmark does not import the MCP SDK for them (``devstack.mcp_client`` calls with it)."""

from __future__ import annotations

from typing import Any

# ``count`` as a raw JSON-RPC request. The backend's ``/raw`` answers ignore it (their final
# message answers id 42 all the same); the edge reads from it the id its answer owes.
CALL: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 42,
    "method": "tools/call",
    "params": {"name": "count", "arguments": {"n": 3, "delay": 0.05}},
}
# What an MCP client of the revision that still resumes (2025-11-25) sends with it.
MCP_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": "2025-11-25",
}
