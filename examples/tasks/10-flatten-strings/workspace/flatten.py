def flatten(value):
    """Nested lists as one flat list; strings and numbers are items."""
    out = []
    for item in value:
        if hasattr(item, "__iter__"):
            out.extend(flatten(item))
        else:
            out.append(item)
    return out
