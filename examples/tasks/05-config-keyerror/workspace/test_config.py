from config import load_config


def test_defaults():
    config = load_config({})
    assert config["port"] == 8080
    assert config["timeout_ms"] == 30000
