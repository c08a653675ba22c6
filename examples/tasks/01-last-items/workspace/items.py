def last_items(items, n):
    """The last n items of items, in order."""
    return items[-n - 1:]
