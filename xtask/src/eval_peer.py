"""mini-swe-agent on one task of `cargo xtask eval`: its own text-based configuration
(`mini_textbased.yaml`: one bash block per answer), its local environment in the task's
throwaway copy, the same server, model and turn limit as Nerve. Prints one JSON line:
exit status, model calls, tokens.

Arguments: task file, workspace, base URL (.../v1), API key, model name, step limit,
wall-clock limit (s), trajectory path.
"""

import json
import os
import sys
from pathlib import Path

import yaml

os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")

from minisweagent import package_dir  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel  # noqa: E402

task_file, workspace, base, key, model, steps, wall, trajectory = sys.argv[1:9]
config = yaml.safe_load(Path(package_dir / "config" / "mini_textbased.yaml").read_text())
agent_config = config["agent"]
agent_config.update(
    step_limit=int(steps),
    cost_limit=0,
    wall_time_limit_seconds=int(wall),
    mode="yolo",
    output_path=Path(trajectory),
)
agent_config.pop("mode", None)
model_config = config.get("model", {})
model_config.update(
    model_name=f"openai/{model}",
    model_kwargs={"api_base": base, "api_key": key, "temperature": 0.0, "max_tokens": 4096},
    cost_tracking="ignore_errors",
)
env_config = config.get("environment", {})
env_config["cwd"] = workspace
# The task's tests run with the Python the xtask names first on PATH (one with pytest).
env_config.setdefault("env", {})["PATH"] = os.environ["PATH"]

agent = DefaultAgent(
    LitellmTextbasedModel(**model_config),
    LocalEnvironment(**env_config),
    **agent_config,
)
try:
    result = agent.run(Path(task_file).read_text())
    status = result.get("exit_status", "")
except Exception as error:  # the agent's own crash is a result too
    status = f"crash: {type(error).__name__}: {error}"
tokens_in = tokens_out = 0
for message in agent.messages:
    usage = (message.get("extra") or {}).get("response", {})
    usage = usage.get("usage") if isinstance(usage, dict) else None
    if usage:
        tokens_in += usage.get("prompt_tokens") or 0
        tokens_out += usage.get("completion_tokens") or 0
print(
    json.dumps(
        {
            "exit_status": status,
            "model_calls": agent.n_calls,
            "input_tokens": tokens_in,
            "output_tokens": tokens_out,
        }
    )
)
