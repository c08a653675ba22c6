def parse_line(line):
    """The fields of one CSV line; quoted fields may hold commas."""
    return line.strip().split(",")
