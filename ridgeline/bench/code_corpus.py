"""Small programs the code-editing workload asks to edit: written for this project (no third-party
code), plain Python of the kind people paste into a chat, each with identifiers worth renaming."""
from __future__ import annotations

# (identifier to rename, code)
SNIPPETS = [
    ("items", '''def binary_search(items, target):
    """Index of target in the sorted list items, or -1."""
    low, high = 0, len(items) - 1
    while low <= high:
        middle = (low + high) // 2
        if items[middle] == target:
            return middle
        if items[middle] < target:
            low = middle + 1
        else:
            high = middle - 1
    return -1
'''),
    ("counts", '''from collections import Counter


def top_words(text, limit=10):
    """The limit most frequent words of text, with their counts."""
    counts = Counter()
    for line in text.splitlines():
        for word in line.lower().split():
            word = word.strip(".,;:!?\\"'()")
            if word:
                counts[word] += 1
    return counts.most_common(limit)
'''),
    ("balance", '''class Account:
    def __init__(self, owner, balance=0.0):
        self.owner = owner
        self.balance = balance
        self.history = []

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("deposit must be positive")
        self.balance += amount
        self.history.append(("deposit", amount))

    def withdraw(self, amount):
        if amount > self.balance:
            raise ValueError("insufficient funds")
        self.balance -= amount
        self.history.append(("withdraw", amount))
'''),
    ("grid", '''def neighbours(grid, row, col):
    """Values of the up to eight cells around (row, col) in a list of lists."""
    found = []
    for dr in (-1, 0, 1):
        for dc in (-1, 0, 1):
            if dr == 0 and dc == 0:
                continue
            r, c = row + dr, col + dc
            if 0 <= r < len(grid) and 0 <= c < len(grid[r]):
                found.append(grid[r][c])
    return found


def step(grid):
    """One generation of the game of life on a grid of 0s and 1s."""
    nxt = []
    for row in range(len(grid)):
        line = []
        for col in range(len(grid[row])):
            alive = sum(neighbours(grid, row, col))
            line.append(1 if alive == 3 or (grid[row][col] and alive == 2) else 0)
        nxt.append(line)
    return nxt
'''),
    ("cache", '''import time


class TimedCache:
    """A dictionary whose entries expire ttl seconds after they were set."""

    def __init__(self, ttl=60.0):
        self.ttl = ttl
        self.cache = {}

    def set(self, key, value):
        self.cache[key] = (value, time.monotonic() + self.ttl)

    def get(self, key, default=None):
        entry = self.cache.get(key)
        if entry is None:
            return default
        value, expires = entry
        if time.monotonic() > expires:
            del self.cache[key]
            return default
        return value
'''),
    ("rows", '''import csv


def load_scores(path):
    """Average score per student from a CSV file with columns name,score."""
    rows = {}
    with open(path, newline="") as handle:
        for record in csv.DictReader(handle):
            name = record["name"].strip()
            rows.setdefault(name, []).append(float(record["score"]))
    return {name: sum(values) / len(values) for name, values in rows.items()}
'''),
    ("queue", '''from collections import deque


def shortest_path(graph, start, goal):
    """Fewest-edges path from start to goal in a dict of adjacency lists, or None."""
    queue = deque([start])
    parent = {start: None}
    while queue:
        node = queue.popleft()
        if node == goal:
            path = []
            while node is not None:
                path.append(node)
                node = parent[node]
            return path[::-1]
        for nxt in graph.get(node, []):
            if nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
    return None
'''),
    ("total", '''def invoice_total(lines, tax_rate=0.2, discount=0.0):
    """Total of (description, quantity, unit price) lines, after discount, with tax."""
    total = 0.0
    for description, quantity, price in lines:
        if quantity < 0 or price < 0:
            raise ValueError(f"bad line: {description}")
        total += quantity * price
    total -= total * discount
    return round(total * (1 + tax_rate), 2)
'''),
]
