from config import load_config


def test_override_timeout():
    config = load_config({"timeout_secs": 5, "port": 9000})
    assert config["timeout_ms"] == 5000
    assert config["port"] == 9000
    assert config["host"] == "localhost"
