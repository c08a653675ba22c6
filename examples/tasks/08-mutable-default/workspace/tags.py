def with_tag(tag, tags=[]):
    """tags with tag appended; a new list when tags is not given."""
    tags.append(tag)
    return tags
