def distance(a, b):
    """The Euclidean distance between points a and b, each (x, y)."""
    dx = a[0] - b[0]
    dy = a[1] - b[1]
    return math.sqrt(dx * dx + dy * dy)
