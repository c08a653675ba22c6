def with_tag(tag, tags=None):
    """tags with tag appended; a new list when tags is not given."""
    if tags is None:
        tags = []
    tags.append(tag)
    return tags
