"""An ACP client on the official Python SDK (`agent-client-protocol` from PyPI), driving
`nerve acp` for the end-to-end tests (tests/e2e/acp.rs).

    python client.py PLAN.json

The plan names the agent's command line and a list of steps; the script runs them in order
and prints one JSON object on stdout: what each step returned, every session update the
client received, every permission request it answered, and every raw line the agent sent
(for the tests that look for secrets on the stream). A step that fails is recorded, not
raised: the test decides what it means.

Steps (`op`):
  initialize                      protocol 1, client_info acp-e2e 0.1
  new_session {cwd}               -> session_id (kept for the steps after it)
  load_session {cwd, session_id}  -> the updates received while loading
  prompt {text}                   -> stop_reason, and the seconds from sending it to the
                                  first agent_message_chunk (first_chunk_secs) and from
                                  starting the agent's process to it (first_chunk_since_spawn_secs)
  prompt_cancel {text, after}     prompt; once an update of kind `after` (e.g. tool_call)
                                  has arrived, session/cancel; -> stop_reason and the
                                  seconds from the cancel to the answer
  prompt_abandon {text}           prompt; once a permission is asked (answer it "never"),
                                  the client closes without answering; the last step
  set_mode {mode}
  unknown_method                  a request for a method no agent has -> the error
  malformed                       a line that is not JSON -> the error the agent answered
"""

import asyncio
import json
import os
import sys
import time

import acp
from acp import spawn_agent_process, text_block
from acp.connection import StreamDirection
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    Implementation,
    RequestPermissionResponse,
)


class Recorder:
    """The client side: records updates, answers permission requests from a queue."""

    def __init__(self, answers):
        self.updates = []
        self.permissions = []
        self.answers = list(answers)
        self.arrived = asyncio.Event()
        self.asked = asyncio.Event()
        # When the first agent_message_chunk of the current prompt arrived.
        self.first_chunk = None

    async def session_update(self, session_id, update, **kwargs):
        dumped = update.model_dump(mode="json", by_alias=True, exclude_none=True)
        if dumped.get("sessionUpdate") == "agent_message_chunk" and self.first_chunk is None:
            self.first_chunk = time.monotonic()
        self.updates.append(dumped)
        self.arrived.set()

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        answer = self.answers.pop(0) if self.answers else "reject_once"
        self.asked.set()
        self.permissions.append(
            {
                "tool_call": tool_call.model_dump(mode="json", by_alias=True, exclude_none=True),
                "options": [o.model_dump(mode="json", by_alias=True) for o in options],
                "answer": answer,
            }
        )
        if answer == "never":
            # The person walks away: no answer, ever (the client closes instead).
            await asyncio.Event().wait()
        if answer == "cancelled":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=answer)
        )

    async def write_text_file(self, *args, **kwargs):
        raise acp.RequestError.method_not_found("fs/write_text_file")

    async def read_text_file(self, *args, **kwargs):
        raise acp.RequestError.method_not_found("fs/read_text_file")

    def on_connect(self, conn):
        pass


def error_of(exc):
    return {"code": getattr(exc, "code", None), "message": str(exc), "data": getattr(exc, "data", None)}


async def main(plan):
    recorder = Recorder(plan.get("permissions", []))
    raw = []

    def observe(event):
        if event.direction == StreamDirection.INCOMING:
            raw.append(event.message)

    results = []
    stderr = open(plan["stderr"], "ab")
    command = plan["command"]
    spawned = time.monotonic()
    async with spawn_agent_process(
        recorder,
        command[0],
        *command[1:],
        env=dict(os.environ),
        transport_kwargs={"stderr": stderr.fileno(), "shutdown_timeout": 60.0},
        observers=[observe],
    ) as (conn, process):
        session_id = None
        for step in plan["steps"]:
            op = step["op"]
            result = {"op": op}
            try:
                if op == "initialize":
                    response = await conn.initialize(
                        protocol_version=1,
                        client_capabilities=ClientCapabilities(),
                        client_info=Implementation(name="acp-e2e", version="0.1"),
                    )
                    result["response"] = response.model_dump(mode="json", by_alias=True, exclude_none=True)
                elif op == "new_session":
                    response = await conn.new_session(cwd=step["cwd"], mcp_servers=[])
                    session_id = response.session_id
                    result["session_id"] = session_id
                    result["response"] = response.model_dump(mode="json", by_alias=True, exclude_none=True)
                elif op == "load_session":
                    before = len(recorder.updates)
                    session_id = step["session_id"]
                    await conn.load_session(cwd=step["cwd"], session_id=session_id, mcp_servers=[])
                    result["replayed"] = recorder.updates[before:]
                elif op == "prompt":
                    before = len(recorder.updates)
                    recorder.first_chunk = None
                    sent = time.monotonic()
                    response = await conn.prompt(session_id=session_id, prompt=[text_block(step["text"])])
                    result["stop_reason"] = response.stop_reason
                    if recorder.first_chunk is not None:
                        result["first_chunk_secs"] = recorder.first_chunk - sent
                        result["first_chunk_since_spawn_secs"] = recorder.first_chunk - spawned
                    result["updates"] = recorder.updates[before:]
                elif op == "prompt_cancel":
                    before = len(recorder.updates)
                    task = asyncio.create_task(
                        conn.prompt(session_id=session_id, prompt=[text_block(step["text"])])
                    )
                    deadline = time.monotonic() + 300
                    # Ends: once the awaited update has arrived, or at the deadline.
                    while not any(
                        u.get("sessionUpdate") == step["after"] for u in recorder.updates[before:]
                    ):
                        if task.done() or time.monotonic() > deadline:
                            break
                        recorder.arrived.clear()
                        try:
                            await asyncio.wait_for(recorder.arrived.wait(), timeout=1.0)
                        except asyncio.TimeoutError:
                            pass
                    cancelled_at = time.monotonic()
                    await conn.cancel(session_id=session_id)
                    response = await task
                    result["cancel_secs"] = time.monotonic() - cancelled_at
                    result["stop_reason"] = response.stop_reason
                    result["updates"] = recorder.updates[before:]
                elif op == "prompt_abandon":
                    # The prompt runs until a permission is asked; then the client goes
                    # away without answering (the steps after it are not run).
                    abandoned = asyncio.create_task(
                        conn.prompt(session_id=session_id, prompt=[text_block(step["text"])])
                    )
                    # Its answer never comes: the connection closes under it.
                    abandoned.add_done_callback(lambda task: task.cancelled() or task.exception())
                    await asyncio.wait_for(recorder.asked.wait(), timeout=300)
                    result["asked"] = True
                    results.append(result)
                    break
                elif op == "set_mode":
                    await conn.set_session_mode(session_id=session_id, mode_id=step["mode"])
                    result["ok"] = True
                elif op == "unknown_method":
                    await conn._conn.send_request("nerve/no_such_method", {})
                elif op == "malformed":
                    before = len(raw)
                    process.stdin.write(b"{this is not json\n")
                    await process.stdin.drain()
                    deadline = time.monotonic() + 60
                    # Ends: once an answer without an id arrived, or at the deadline.
                    while time.monotonic() < deadline:
                        answers = [m for m in raw[before:] if "error" in m and m.get("id") is None]
                        if answers:
                            result["error"] = answers[0]["error"]
                            break
                        await asyncio.sleep(0.05)
                else:
                    result["error"] = {"message": f"unknown step {op}"}
            except Exception as exc:  # recorded for the test to judge
                result["error"] = error_of(exc)
            results.append(result)
        await conn.close()
    stderr.close()
    print(
        json.dumps(
            {
                "steps": results,
                "updates": recorder.updates,
                "permissions": recorder.permissions,
                "raw": raw,
            }
        )
    )


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        asyncio.run(main(json.load(f)))
