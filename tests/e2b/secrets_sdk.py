"""E2B's Secrets API through the official Python client against brig's
control plane: create, get_info (by name and id), list with paging,
update (a new version; metadata kept or replaced), exists, destroy; the
value never comes back; bad names are refused by the server as by E2B.
"""

import sys

from e2b import Secret
from e2b.exceptions import SecretException, SecretNotFoundException
from sdk_checks import check, raises, summary

VALUE = "sk-live-e2b-secret-value"

made = Secret.create("Openai-Key", VALUE, metadata={"team": "ml"})
check("create: name kept lower-cased", made.name == "openai-key", made)
check("create: version 1", made.version == 1, made)
check("create: an id", made.secret_id.startswith("sec_"), made)
check("create: metadata", made.metadata == {"team": "ml"}, made)
check("create: no value anywhere", VALUE not in repr(made), repr(made))

by_name = Secret.get_info("openai-key")
by_id = Secret.get_info(made.secret_id)
check("get_info by name and by id", by_name.secret_id == by_id.secret_id == made.secret_id)

up = Secret.update("openai-key", "sk-2")
check("update: next version", up.version == 2, up)
check("update: metadata kept", up.metadata == {"team": "ml"}, up)
up = Secret.update(made.secret_id, "sk-3", metadata={})
check("update: metadata replaced", up.version == 3 and up.metadata == {}, up)

raises("create: the name is taken", (SecretException,), lambda: Secret.create("openai-key", "x"))
raises("create: a bad name", (SecretException,), lambda: Secret.create("bad name", "x"))
raises("update: unknown", (SecretNotFoundException,), lambda: Secret.update("nope", "x"))
raises("get_info: unknown", (SecretNotFoundException,), lambda: Secret.get_info("nope"))

for n in range(3):
    Secret.create(f"page-{n}", "v")
paginator = Secret.list(limit=2)
names, pages = [], 0
while paginator.has_next:
    items = paginator.next_items()
    pages += 1
    names += [i.name for i in items]
check("list: every secret, page by page", names == ["openai-key", "page-0", "page-1", "page-2"], names)
check("list: pages of two", pages == 2, pages)

check("exists", Secret.exists("openai-key") and not Secret.exists("nope"))
check("destroy", Secret.destroy("openai-key"))
check("destroy: again is False", Secret.destroy("openai-key") is False)
check("exists: gone", not Secret.exists("openai-key"))
for n in range(3):
    Secret.destroy(f"page-{n}")
summary()
