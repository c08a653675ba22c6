DEFAULTS = {
    "host": "localhost",
    "port": 8080,
    "timeout_secs": 30,
}
