"""Anchor for `cargo xtask bench fleet`: LangGraph's ReAct agent with its PostgreSQL
checkpointer (langgraph-checkpoint-postgres), driven by a scripted chat model that asks for
one tool call per turn, then answers. No LLM latency: what is left is the framework's own
cost per durable turn.

    langgraph_postgres.py URL single TURNS
        one agent, TURNS turns: prints us_per_turn
    langgraph_postgres.py URL fleet EXECUTIONS TURNS PROCESSES
        EXECUTIONS agents at once (threads spread over PROCESSES processes, as Nerve's
        executions over its workers), TURNS turns each: prints turns_per_s and the p50/p99
        latency of the checkpointer's durable writes (put and put_writes)
"""
import multiprocessing as mp
import sys
import threading
import time
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.prebuilt import create_react_agent
from psycopg_pool import ConnectionPool


@tool
def read_file(path: str) -> str:
    """Read a file."""
    return "x" * 200


class Scripted(GenericFakeChatModel):
    def bind_tools(self, tools: Any, **kw: Any):
        return self


def script(turns):
    for i in range(turns):
        yield AIMessage(content=f"step {i}", tool_calls=[{"name": "read_file", "args": {"path": f"f{i}.txt"}, "id": f"c{i}"}])
    yield AIMessage(content="done")


class Timed(PostgresSaver):
    """The checkpointer, timing each durable write."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.latencies = []
        self.lock = threading.Lock()

    def _timed(self, method, *a, **kw):
        t0 = time.perf_counter()
        out = method(*a, **kw)
        dt = time.perf_counter() - t0
        with self.lock:
            self.latencies.append(dt)
        return out

    def put(self, *a, **kw):
        return self._timed(super().put, *a, **kw)

    def put_writes(self, *a, **kw):
        return self._timed(super().put_writes, *a, **kw)


def saver(url, size):
    pool = ConnectionPool(url, min_size=1, max_size=size, kwargs={"autocommit": True, "prepare_threshold": 0})
    s = Timed(pool)
    return pool, s


def run_agent(s, turns, thread_id):
    agent = create_react_agent(Scripted(messages=script(turns)), [read_file], checkpointer=s)
    out = agent.invoke({"messages": [("user", "go")]}, {"configurable": {"thread_id": thread_id}, "recursion_limit": 10 * turns + 10})
    assert out["messages"][-1].content == "done", out["messages"][-1]


def worker(url, threads, turns, prefix, start, results):
    pool, s = saver(url, threads)
    start.wait()
    t0 = time.perf_counter()
    ts = [threading.Thread(target=run_agent, args=(s, turns, f"{prefix}-{i}")) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    results.put((t0, time.perf_counter(), s.latencies))
    pool.close()


def main():
    url, mode = sys.argv[1], sys.argv[2]
    pool, s = saver(url, 4)
    s.setup()
    if mode == "single":
        turns = int(sys.argv[3])
        t0 = time.perf_counter()
        run_agent(s, turns, "single")
        dt = time.perf_counter() - t0
        print(f"langgraph-postgres turns={turns} total_s={dt:.3f} us_per_turn={dt / turns * 1e6:.0f}")
        return
    executions, turns, processes = (int(v) for v in sys.argv[3:6])
    pool.close()
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    per = [executions // processes + (1 if i < executions % processes else 0) for i in range(processes)]
    procs = [ctx.Process(target=worker, args=(url, n, turns, f"p{i}", start, results)) for i, n in enumerate(per)]
    for p in procs:
        p.start()
    time.sleep(2)  # every process connected and imported before the clock starts
    start.set()
    got = [results.get() for _ in procs]
    for p in procs:
        p.join()
    begin = min(g[0] for g in got)
    end = max(g[1] for g in got)
    lat = sorted(x for g in got for x in g[2])
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3
    total = executions * turns
    print(f"langgraph-postgres executions={executions} turns={turns} processes={processes} total_s={end - begin:.3f} turns_per_s={total / (end - begin):.1f} writes={len(lat)} p50_ms={p(0.5):.2f} p99_ms={p(0.99):.2f}")


if __name__ == "__main__":
    main()
