def slugify(title):
    """ "Hello World" -> "hello-world" """
    words = title.lower().split()
    return "-".join(words)
