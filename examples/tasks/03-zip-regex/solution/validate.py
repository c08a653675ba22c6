import re

ZIP = re.compile(r"\d{5}")


def is_zip_code(text):
    """True when text is exactly five digits."""
    return ZIP.fullmatch(text) is not None
