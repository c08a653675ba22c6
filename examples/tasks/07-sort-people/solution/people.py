def by_age(people):
    """People (name, age) sorted by age, then by name."""
    return sorted(people, key=lambda person: (person[1], person[0]))
