import csv


def parse_line(line):
    """The fields of one CSV line; quoted fields may hold commas."""
    return next(csv.reader([line.strip()]))
