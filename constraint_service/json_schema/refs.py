"""Identifiers and `$ref` resolution: the `$id` / `id` / `$anchor` index with base URIs (JSON Schema
core 8.2) and JSON Pointer fragments."""
from __future__ import annotations

from .common import DEFAULT_BASE, MAX_VALUE_DEPTH, SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_ONE, esc, unesc
from .ir import Box, Node, Ref


class RefsMixin:
    """Identifiers and `$ref` resolution; methods of `reduce.Reducer` (state: Reducer.__init__)."""

    # ---- refs ------------------------------------------------------------
    def index_ids(self):
        """Collect $id/id identifiers and $anchor names with their base URIs (JSON Schema core 8.2)."""
        from urllib.parse import urldefrag, urljoin
        root_base = DEFAULT_BASE
        self.resources[""] = ""

        def walk(s, ptr, base, depth):
            if depth > MAX_VALUE_DEPTH:
                return
            if isinstance(s, dict):
                ident = s.get(self.id_keyword)
                if self.draft7 and "$ref" in s:
                    ident = None  # drafts 4-7: a sibling of $ref (even $id) is ignored
                if isinstance(ident, str):
                    uri, frag = urldefrag(urljoin(base, ident))
                    if uri:
                        base = uri
                        self.resources.setdefault(uri, ptr)
                    if frag and not frag.startswith("/"):
                        self.named_anchors.setdefault((base, frag), ptr)  # draft-06/07 "$id": "#name"
                    self.bases[ptr] = base
                a = s.get("$anchor")
                if isinstance(a, str):
                    self.named_anchors.setdefault((base, a), ptr)
                    self.anchors.setdefault(a, ptr)
                for k, v in s.items():
                    kp = f"{ptr}/{esc(k)}"
                    if k in SCHEMA_MAPS and isinstance(v, dict):
                        for name, sub in v.items():
                            walk(sub, f"{kp}/{esc(name)}", base, depth + 1)
                    elif k in SCHEMA_LISTS and isinstance(v, list):
                        for i, sub in enumerate(v):
                            walk(sub, f"{kp}/{i}", base, depth + 1)
                    elif k in SCHEMA_ONE or (k in SCHEMA_LISTS and isinstance(v, dict)):
                        walk(v, kp, base, depth + 1)
                    # anything else (unknown keywords, enum/const values) holds no identifiers
        if isinstance(self.root, dict):
            ident = self.root.get(self.id_keyword)
            if isinstance(ident, str):
                uri = urldefrag(urljoin(DEFAULT_BASE, ident))[0]
                if uri:
                    root_base = uri
        self.resources[root_base] = ""
        self.resources[DEFAULT_BASE] = ""
        self.bases[""] = root_base
        walk(self.root, "", root_base, 0)

    def base_of(self, ptr: str) -> str:
        """Base URI in force at the schema at `ptr` (the nearest enclosing $id/id)."""
        while True:
            if ptr in self.bases:
                return self.bases[ptr]
            if not ptr:
                return DEFAULT_BASE
            ptr = ptr[:ptr.rindex("/")]

    def follow(self, start: str, frag: str, ref: str, ptr: str):
        """The value at JSON Pointer `frag` (URI-decoded) from the document position `start`."""
        from urllib.parse import unquote
        cur = self.root
        path = ""
        for raw in [t for t in start.split("/")[1:]] if start else []:
            tok = unesc(raw)
            cur = cur[int(tok)] if isinstance(cur, list) else cur[tok]
            path += "/" + raw
        if frag == "":
            return cur, path
        for raw in frag[1:].split("/"):
            tok = unesc(unquote(raw))
            if isinstance(cur, dict) and tok in cur:
                cur = cur[tok]
            elif isinstance(cur, list) and tok.isdigit() and int(tok) < len(cur):
                cur = cur[int(tok)]
            else:
                self.invalid(ptr, f"unresolvable $ref {ref!r}")
            path += "/" + esc(tok)
        return cur, path

    def lookup(self, ref: str, ptr: str, at: str | None = None):
        """Resolve `ref` (written in the schema at document pointer `at`) against the base URI in force
        there: local JSON Pointers, $id/id-identified resources of this document, $anchor / "#name"
        anchors. Anything else is an external reference (UnsupportedSchema at `ptr`)."""
        from urllib.parse import unquote, urldefrag, urljoin
        if not self.bases:
            self.index_ids()
        if at is None:
            at = ptr[:-len("/$ref")] if ptr.endswith("/$ref") else ptr
        try:
            uri, frag = urldefrag(urljoin(self.base_of(at), ref))
        except ValueError:
            self.invalid(ptr, f"malformed $ref {ref!r}")
        if uri not in self.resources:
            self.unsupported(ptr, f"external or non-local $ref {ref!r} is not supported")
        start = self.resources[uri]
        if frag == "" or frag.startswith("/"):
            return self.follow(start, frag, ref, ptr)
        name = unquote(frag)
        if (uri, name) in self.named_anchors:
            return self.follow(self.named_anchors[(uri, name)], "", ref, ptr)
        if uri == self.bases[""] and name in self.anchors:
            return self.follow(self.anchors[name], "", ref, ptr)
        self.invalid(ptr, f"unresolvable $ref {ref!r} (no anchor {name!r})")

    def ref_node(self, ref: str, ptr: str) -> Node:
        target, path = self.lookup(ref, ptr)
        box = self.boxes.get(path)
        if box is None:
            box = Box(path)
            self.boxes[path] = box
            box.building = True
            box.node = None
            box.node = self.translate(target, path)
            box.building = False
        return Ref(box)
