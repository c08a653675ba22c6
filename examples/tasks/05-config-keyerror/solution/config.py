from defaults import DEFAULTS


def load_config(overrides):
    """The defaults with overrides applied, and the timeout in milliseconds added."""
    config = dict(DEFAULTS)
    config.update(overrides)
    config["timeout_ms"] = config["timeout_secs"] * 1000
    return config
