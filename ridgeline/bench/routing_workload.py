"""The multi-tenant workload of `ridgeline bench routing`: T tenants, each a system prompt of about
P tokens shared by all its requests, each request that prompt plus a short question of its own,
arriving with the tenants interleaved (a shuffled round over the tenants, again and again)."""
from __future__ import annotations

import random

WORDS = ("account billing customer order shipping refund policy product warranty support ticket invoice "
         "payment delivery return exchange subscription plan upgrade discount coupon balance statement "
         "address phone email password login security privacy contract renewal cancellation fee charge "
         "credit debit transfer branch service hours holiday schedule appointment booking reservation "
         "flight hotel room luggage baggage seat meal ticket gate boarding weather forecast temperature "
         "rain wind storm travel insurance claim damage repair replacement inspection report manager "
         "agent escalation priority urgent normal low high medium quality feedback survey rating review").split()


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def system_prompt(tokenizer, tenant: int, tokens: int, seed: int) -> str:
    """About `tokens` tokens (rendered alone): a tenant's instructions, distinct from the first word."""
    rng = random.Random(seed * 1000 + tenant)
    head = f"You are the assistant of tenant {tenant}. Follow these rules. "
    words = [rng.choice(WORDS) for _ in range(tokens)]
    lo, hi = 1, len(words)
    while lo < hi:  # the most words whose text stays within the token budget
        mid = (lo + hi + 1) // 2
        if len(tokenizer.encode(head + " ".join(words[:mid]), add_special_tokens=False)) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return head + " ".join(words[:lo])


def routing_workload(tokenizer, tenants: int, prefix_tokens: int, per_tenant: int, question_words: int,
                     seed: int) -> list[tuple[int, list[dict]]]:
    """(tenant, chat messages) per request, in arrival order."""
    rng = random.Random(seed)
    systems = [system_prompt(tokenizer, t, prefix_tokens, seed) for t in range(tenants)]
    out = []
    for round_ in range(per_tenant):
        order = list(range(tenants))
        rng.shuffle(order)
        for t in order:
            question = f"Question {round_}-{t}: " + _text(rng, question_words) + "?"
            out.append((t, [{"role": "system", "content": systems[t]}, {"role": "user", "content": question}]))
    return out
