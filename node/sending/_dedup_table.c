/* The duplicate window's key store, compiled (node/sending/dedup_keys.py has its pure twin,
KeyWindow, and picks between them).

A KeyTable maps (topic, UNIQ_KEY) -> entry and keeps the keys' age order. An entry is the five
integers a duplicate's reply needs (phys offset, size, queue id, queue offset, store ms), read
from the put's dispatch request when the key is added: the request itself is not kept, so it is
freed while still in the cache, not 100,000 keys later. It is sized once from the window's
count bound, so a window at steady state never rehashes (a dict of 100,000 keys stalls the loop
several ms each time it resizes).

Rules:
1. Open addressing, linear probing, over a 64-bit hash of the pair (Python's own str hashes,
   which are keyed per process and cached in the str, mixed together). A slot holds the low
   32 bits of the hash (its home slot among them, so moving slots reads no node) and the
   node's index; a hit is only a hit when the node's full hash, topic and key are equal, so a
   collision can never make a new message a duplicate. Deletion shifts the following cluster
   back (no tombstones, no slow-down with age).
2. Nodes live in one array, linked oldest to newest: a key stored again moves to the newest
   end; eviction and a cut of the log take nodes off the ends, O(1) per key. Freed nodes are
   reused newest-freed first (warm in the cache).
3. The slot table has at least twice as many slots as nodes. The node array starts at the
   count bound plus headroom for a put (a window holds more than its bound only between a
   put and its eviction); a put larger than that headroom doubles it once (a rehash), never
   again at the same size.
4. Keys are exact str (TypeError otherwise, before anything changes). A key of at most
   KEY_INLINE one-byte characters (a UNIQ_KEY: 32 hex digits) is copied into its node, so
   eviction touches no str object; a longer or wider key keeps its str. A node keeps a
   reference to its topic's str (few, shared, warm). An entry is a tuple (TypeError otherwise,
   as in the pure twin) whose fields, read at add time (their indexes given at construction),
   are ints: no Python code runs while a run is added. All are read before anything changes.
   The error texts are the pure twin's.
5. A batch's keys are hashed first and their slots prefetched, then probed: the misses of a
   table larger than the caches overlap instead of following one another (eviction likewise
   prefetches the slots of the next nodes it drops).
6. A run added with keep_first is all or nothing: a key held already, or twice in the run,
   undoes the run's new nodes (nothing else changed yet) and answers False.
7. add_requests takes a put's dispatch requests themselves (topic and key read in place, at
   key_fields) and declines, changing nothing, a put with a key unset or an exempt topic (the
   caller's system topics and prefixes): the message-by-message path then serves it.
8. The public CPython API only; no library beyond libc.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define KEY_INLINE 39
#define FIELDS 5      /* an entry: phys, size, queue id, queue offset, store ms */
#define F_PHYS 0
#define F_STORE_MS 4

typedef struct {
    uint64_t hash;
    PyObject *topic;       /* owned while the node is in use */
    PyObject *uniq;        /* owned; NULL when the key is inline */
    int64_t f[FIELDS];
    int32_t older, newer;  /* age order (-1: none); a free node chains through `newer` */
    uint8_t klen;
    char key[KEY_INLINE];  /* an inline key's one-byte characters */
} node_t;

typedef struct {
    uint32_t tag;   /* the hash's low 32 bits: the home slot is tag & mask */
    uint32_t node;  /* node index + 1; 0: empty slot */
} slot_t;

typedef struct {
    PyObject_HEAD
    node_t *nodes;
    int32_t cap, unused;      /* nodes allocated; the first never used */
    int32_t free_list, oldest, newest;
    Py_ssize_t live;
    slot_t *slots;
    uint32_t mask;            /* slots - 1 */
    uint64_t hash_mask;       /* all ones; tests narrow it to force collisions */
    Py_ssize_t fields[FIELDS];  /* where an added entry holds each field */
    Py_ssize_t key_fields[2];   /* where a dispatch request holds its topic and key; -1: none */
} KeyTable;

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)(p))
#endif
#define CHUNK 32      /* keys hashed and prefetched ahead of their probes (rule 5) */

static const char NOT_STR[] = "a duplicate window key must be a str";
static const char LENGTHS[] = "keys and entries differ in length";
static const char NOT_TUPLE[] = "a duplicate window entry must be a tuple of its fields";

static inline uint64_t
mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* Exact str only (rule 4): their hash never fails. */
static inline uint64_t
key_hash(KeyTable *t, PyObject *topic, PyObject *uniq)
{
    uint64_t a = (uint64_t)PyObject_Hash(topic), b = (uint64_t)PyObject_Hash(uniq);
    return mix64(a * 0x9E3779B97F4A7C15ULL ^ b) & t->hash_mask;
}

static inline int
is_inline(PyObject *u)
{
    return PyUnicode_KIND(u) == PyUnicode_1BYTE_KIND && PyUnicode_GET_LENGTH(u) <= KEY_INLINE;
}

static inline int
str_eq(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    Py_ssize_t n = PyUnicode_GET_LENGTH(a);
    int kind = PyUnicode_KIND(a);
    return n == PyUnicode_GET_LENGTH(b) && kind == (int)PyUnicode_KIND(b)
           && memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)n * kind) == 0;
}

/* The node holding (topic, uniq), or -1 with *at the empty slot where it would go. */
static inline int32_t
find(KeyTable *t, PyObject *topic, PyObject *uniq, uint64_t h, uint32_t *at)
{
    uint32_t tag = (uint32_t)h, i = tag & t->mask;
    int inl = is_inline(uniq);
    size_t len = (size_t)PyUnicode_GET_LENGTH(uniq);
    for (;;) {
        slot_t s = t->slots[i];
        if (!s.node) {
            *at = i;
            return -1;
        }
        if (s.tag == tag) {
            node_t *n = &t->nodes[s.node - 1];
            if (n->hash == h
                && (inl ? (!n->uniq && n->klen == len
                           && memcmp(n->key, PyUnicode_1BYTE_DATA(uniq), len) == 0)
                        : (n->uniq && str_eq(n->uniq, uniq)))
                && str_eq(n->topic, topic)) {
                *at = i;
                return (int32_t)s.node - 1;
            }
        }
        i = (i + 1) & t->mask;
    }
}

static void
slot_delete(KeyTable *t, uint32_t i)
{
    uint32_t j = i, mask = t->mask;
    for (;;) {
        j = (j + 1) & mask;
        slot_t s = t->slots[j];
        if (!s.node)
            break;
        uint32_t home = s.tag & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) {  /* i lies on its probe path */
            t->slots[i] = s;
            i = j;
        }
    }
    t->slots[i].node = 0;
}

static int
alloc_slots(KeyTable *t, int32_t nodes)
{
    uint64_t want = 8;
    while (want < 2 * (uint64_t)nodes)
        want <<= 1;
    if (want > ((uint64_t)1 << 31)) {
        PyErr_NoMemory();
        return -1;
    }
    slot_t *slots = PyMem_Calloc((size_t)want, sizeof(slot_t));
    if (!slots) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(t->slots);
    t->slots = slots;
    t->mask = (uint32_t)(want - 1);
    for (int32_t n = t->oldest; n >= 0; n = t->nodes[n].newer) {  /* rehash (rule 3) */
        uint64_t h = t->nodes[n].hash;
        uint32_t i = (uint32_t)h & t->mask;
        while (slots[i].node)
            i = (i + 1) & t->mask;
        slots[i].tag = (uint32_t)h;
        slots[i].node = (uint32_t)n + 1;
    }
    return 0;
}

static int
grow(KeyTable *t)
{
    if (t->cap >= INT32_MAX / 2) {
        PyErr_NoMemory();
        return -1;
    }
    int32_t cap = t->cap * 2;
    node_t *nodes = PyMem_Realloc(t->nodes, (size_t)cap * sizeof(node_t));
    if (!nodes) {
        PyErr_NoMemory();
        return -1;
    }
    t->nodes = nodes;
    if (alloc_slots(t, cap) < 0)
        return -1;  /* the old slots stay, and the old count of nodes in use (rule 3) */
    t->cap = cap;
    return 0;
}

static inline void
link_newest(KeyTable *t, int32_t n)
{
    t->nodes[n].older = t->newest;
    t->nodes[n].newer = -1;
    if (t->newest >= 0)
        t->nodes[t->newest].newer = n;
    else
        t->oldest = n;
    t->newest = n;
}

static inline void
unlink_node(KeyTable *t, int32_t n)
{
    node_t *x = &t->nodes[n];
    if (x->older >= 0)
        t->nodes[x->older].newer = x->newer;
    else
        t->oldest = x->newer;
    if (x->newer >= 0)
        t->nodes[x->newer].older = x->older;
    else
        t->newest = x->older;
}

/* Take node n out of the table; its references are dropped last (rule 2). */
static void
remove_node(KeyTable *t, int32_t n)
{
    node_t *x = &t->nodes[n];
    uint32_t i = (uint32_t)x->hash & t->mask;
    while (t->slots[i].node != (uint32_t)n + 1)
        i = (i + 1) & t->mask;
    slot_delete(t, i);
    unlink_node(t, n);
    PyObject *topic = x->topic, *uniq = x->uniq;
    x->topic = x->uniq = NULL;
    x->newer = t->free_list;
    t->free_list = n;
    t->live--;
    Py_DECREF(topic);
    Py_XDECREF(uniq);
}

/* 1: stored (new or young again), 0: held and keep_first (nothing changed), -1: error. */
static int
put_key(KeyTable *t, PyObject *topic, PyObject *uniq, uint64_t h, const int64_t *f,
        int keep_first)
{
    if (t->live == t->cap && grow(t) < 0)  /* free nodes: cap - live */
        return -1;
    uint32_t at;
    int32_t n = find(t, topic, uniq, h, &at);
    if (n >= 0) {
        if (keep_first)
            return 0;
        memcpy(t->nodes[n].f, f, sizeof(t->nodes[n].f));
        unlink_node(t, n);
        link_newest(t, n);
        return 1;
    }
    if (t->free_list >= 0) {
        n = t->free_list;
        t->free_list = t->nodes[n].newer;
    } else {
        n = t->unused++;
    }
    node_t *x = &t->nodes[n];
    Py_INCREF(topic);
    x->topic = topic;
    if (is_inline(uniq)) {
        x->uniq = NULL;
        x->klen = (uint8_t)PyUnicode_GET_LENGTH(uniq);
        memcpy(x->key, PyUnicode_1BYTE_DATA(uniq), x->klen);
    } else {
        x->uniq = Py_NewRef(uniq);
    }
    memcpy(x->f, f, sizeof(x->f));
    x->hash = h;
    t->slots[at].tag = (uint32_t)h;
    t->slots[at].node = (uint32_t)n + 1;
    link_newest(t, n);
    t->live++;
    return 1;
}

/* An entry's fields (a tuple's items read directly); -1 with an error set. */
static int
read_fields(KeyTable *t, PyObject *entry, int64_t *out)
{
    for (int k = 0; k < FIELDS; k++) {
        Py_ssize_t field = t->fields[k];
        if (!PyTuple_Check(entry) || field >= PyTuple_GET_SIZE(entry)
            || !PyLong_Check(PyTuple_GET_ITEM(entry, field))) {
            PyErr_SetString(PyExc_TypeError, NOT_TUPLE);
            return -1;
        }
        long long x = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, field));
        if (x == -1 && PyErr_Occurred())
            return -1;
        out[k] = x;
    }
    return 0;
}

static PyObject *
entry_of(node_t *x)
{
    return Py_BuildValue("(LLLLL)", (long long)x->f[0], (long long)x->f[1],
                         (long long)x->f[2], (long long)x->f[3], (long long)x->f[4]);
}

static PyObject *
uniq_of(node_t *x)
{
    if (x->uniq)
        return Py_NewRef(x->uniq);
    return PyUnicode_FromKindAndData(PyUnicode_1BYTE_KIND, x->key, x->klen);
}

/* ------------------------------------------------------------------ the type */

static PyObject *
KeyTable_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"size", "fields", "key_fields", "hash_bits", NULL};
    Py_ssize_t size, fields[FIELDS], key_fields[2] = {-1, -1};
    int hash_bits = 64;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n(nnnnn)|(nn)i:KeyTable", kwlist, &size,
                                     &fields[0], &fields[1], &fields[2], &fields[3], &fields[4],
                                     &key_fields[0], &key_fields[1], &hash_bits))
        return NULL;
    int bad = size < 0 || size > INT32_MAX / 4 || hash_bits < 1 || hash_bits > 64
              || (key_fields[0] < 0) != (key_fields[1] < 0);
    for (int k = 0; k < FIELDS; k++)
        bad |= fields[k] < 0;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "KeyTable: size, fields or hash_bits out of range");
        return NULL;
    }
    KeyTable *t = (KeyTable *)type->tp_alloc(type, 0);
    if (!t)
        return NULL;
    /* rule 3: the bound plus an eighth (at least 16) for the put before its eviction */
    t->cap = (int32_t)(size + (size / 8 > 16 ? size / 8 : 16));
    t->free_list = t->oldest = t->newest = -1;
    t->hash_mask = hash_bits == 64 ? ~(uint64_t)0 : (((uint64_t)1 << hash_bits) - 1);
    memcpy(t->fields, fields, sizeof(t->fields));
    memcpy(t->key_fields, key_fields, sizeof(t->key_fields));
    t->nodes = PyMem_Malloc((size_t)t->cap * sizeof(node_t));
    if (!t->nodes || alloc_slots(t, t->cap) < 0) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        Py_DECREF(t);
        return NULL;
    }
    return (PyObject *)t;
}

static void
KeyTable_dealloc(KeyTable *t)
{
    for (int32_t n = t->oldest; n >= 0; n = t->nodes[n].newer) {
        Py_DECREF(t->nodes[n].topic);
        Py_XDECREF(t->nodes[n].uniq);
    }
    PyMem_Free(t->nodes);
    PyMem_Free(t->slots);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static Py_ssize_t
KeyTable_len(KeyTable *t)
{
    return t->live;
}

static PyObject *
KeyTable_get(KeyTable *t, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "get(topic, uniq)");
        return NULL;
    }
    PyObject *topic = args[0], *uniq = args[1];
    if (PyUnicode_CheckExact(topic) && PyUnicode_CheckExact(uniq)) {
        uint32_t at;
        int32_t n = find(t, topic, uniq, key_hash(t, topic, uniq), &at);
        if (n >= 0)
            return entry_of(&t->nodes[n]);
    }
    Py_RETURN_NONE;
}

static PyObject *
KeyTable_holds_none(KeyTable *t, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "holds_none(topic, uniqs)");
        return NULL;
    }
    PyObject *topic = args[0];
    if (!t->live || !PyUnicode_CheckExact(topic))
        Py_RETURN_TRUE;
    PyObject *seq = PySequence_Fast(args[1], "holds_none: uniqs must be iterable");
    if (!seq)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    uint64_t hs[CHUNK];
    uint32_t at;
    for (Py_ssize_t base = 0; base < count; base += CHUNK) {
        Py_ssize_t n = count - base < CHUNK ? count - base : CHUNK;
        for (Py_ssize_t k = 0; k < n; k++) {  /* rule 5 */
            PyObject *u = items[base + k];
            if (PyUnicode_CheckExact(u)) {
                hs[k] = key_hash(t, topic, u);
                PREFETCH(&t->slots[(uint32_t)hs[k] & t->mask]);
            }
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            PyObject *u = items[base + k];
            if (PyUnicode_CheckExact(u) && find(t, topic, u, hs[k], &at) >= 0) {
                Py_DECREF(seq);
                Py_RETURN_FALSE;
            }
        }
    }
    Py_DECREF(seq);
    Py_RETURN_TRUE;
}

/* The adds' arguments: (topic or topics, uniq or uniqs, entry or entries, keep_first=False);
   keep_first, or -1 with an error set. `topic_str`: the first must be a str (else must not). */
static int
add_args(PyObject *const *args, Py_ssize_t nargs, const char *usage, int topic_str)
{
    if (nargs < 3 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    int keep_first = nargs == 4 ? PyObject_IsTrue(args[3]) : 0;
    if (keep_first >= 0 && PyUnicode_CheckExact(args[0]) != topic_str) {
        PyErr_SetString(PyExc_TypeError, NOT_STR);
        return -1;
    }
    return keep_first;
}

static PyObject *
KeyTable_add(KeyTable *t, PyObject *const *args, Py_ssize_t nargs)
{
    int keep_first = add_args(args, nargs, "add(topic, uniq, entry, keep_first=False)", 1);
    if (keep_first < 0)
        return NULL;
    if (!PyUnicode_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, NOT_STR);
        return NULL;
    }
    int64_t f[FIELDS];
    if (read_fields(t, args[2], f) < 0
        || put_key(t, args[0], args[1], key_hash(t, args[0], args[1]), f, keep_first) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Undo a keep_first run's `added` new nodes, the newest ones (rule 5). */
static void
undo_newest(KeyTable *t, Py_ssize_t added)
{
    while (added-- > 0)
        remove_node(t, t->newest);
}

/* Add `count` keys, str all checked: of topic `one`, or of topics tp[i] when it is NULL.
   True, False (keep_first met a held key: nothing changed, rule 6) or NULL with an error. */
static PyObject *
add_keys(KeyTable *t, PyObject *one, PyObject **tp, PyObject **u, PyObject **e,
         Py_ssize_t count, int keep_first)
{
    PyObject *result = NULL;
    /* per key: its FIELDS entry fields, then its hash (rule 5: slots prefetched) */
    int64_t *f = PyMem_Malloc((size_t)(count ? count : 1) * (FIELDS + 1) * sizeof(int64_t));
    if (!f)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t *row = f + i * (FIELDS + 1);
        if (read_fields(t, e[i], row) < 0)
            goto done;
        uint64_t h = key_hash(t, one ? one : tp[i], u[i]);
        row[FIELDS] = (int64_t)h;
        PREFETCH(&t->slots[(uint32_t)h & t->mask]);
    }
    while (t->cap - t->live < count) {  /* room first: no put_key below can fail */
        if (grow(t) < 0)
            goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t *row = f + i * (FIELDS + 1);
        if (!put_key(t, one ? one : tp[i], u[i], (uint64_t)row[FIELDS], row, keep_first)) {
            undo_newest(t, i);  /* keep_first: each key before i made a new node */
            result = Py_NewRef(Py_False);
            goto done;
        }
    }
    result = Py_NewRef(Py_True);
done:
    PyMem_Free(f);
    return result;
}

/* add_run (topic_str: a run of one topic, args[0] its str) and add_mixed (a sequence of
   topics, one per key). */
static PyObject *
add_many(KeyTable *t, PyObject *const *args, Py_ssize_t nargs, const char *usage,
         int topic_str)
{
    int keep_first = add_args(args, nargs, usage, topic_str);
    if (keep_first < 0)
        return NULL;
    PyObject *topics = args[0], *uniqs_in = args[1], *entries_in = args[2];
    PyObject *tseq = NULL, *useq = NULL, *eseq = NULL, *result = NULL;
    int one = topic_str;
    useq = PySequence_Fast(uniqs_in, "uniqs must be a sequence");
    eseq = useq ? PySequence_Fast(entries_in, "entries must be a sequence") : NULL;
    tseq = (eseq && !one) ? PySequence_Fast(topics, "topics must be a sequence") : NULL;
    if (!eseq || (!one && !tseq))
        goto done;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(useq);
    if (count != PySequence_Fast_GET_SIZE(eseq)
        || (!one && count != PySequence_Fast_GET_SIZE(tseq))) {
        PyErr_SetString(PyExc_ValueError, LENGTHS);
        goto done;
    }
    PyObject **u = PySequence_Fast_ITEMS(useq), **e = PySequence_Fast_ITEMS(eseq);
    PyObject **tp = one ? NULL : PySequence_Fast_ITEMS(tseq);
    for (Py_ssize_t i = 0; i < count; i++) {  /* rule 4: checked before anything changes */
        if (!PyUnicode_CheckExact(u[i]) || (tp && !PyUnicode_CheckExact(tp[i]))) {
            PyErr_SetString(PyExc_TypeError, NOT_STR);
            goto done;
        }
    }
    result = add_keys(t, one ? topics : NULL, tp, u, e, count, keep_first);
done:
    Py_XDECREF(tseq);
    Py_XDECREF(useq);
    Py_XDECREF(eseq);
    return result;
}

static PyObject *
KeyTable_add_run(KeyTable *t, PyObject *const *args, Py_ssize_t nargs)
{
    return add_many(t, args, nargs, "add_run(topic, uniqs, entries, keep_first=False)", 1);
}

static PyObject *
KeyTable_add_mixed(KeyTable *t, PyObject *const *args, Py_ssize_t nargs)
{
    /* one str is not a sequence of topics here */
    return add_many(t, args, nargs, "add_mixed(topics, uniqs, entries, keep_first=False)", 0);
}

/* Is `topic` exempt: in `names` (a set) or starting with one of `prefixes` (a tuple)? */
static int
exempt(PyObject *topic, PyObject *names, PyObject *prefixes)
{
    int found = PySet_Contains(names, topic);
    for (Py_ssize_t i = 0; !found && i < PyTuple_GET_SIZE(prefixes); i++)
        found = (int)PyUnicode_Tailmatch(topic, PyTuple_GET_ITEM(prefixes, i), 0,
                                         PY_SSIZE_T_MAX, -1);
    return found;
}

/* add_requests' walk: each request's topic and key into tp and u; 1: all set and none
   exempt, 0: declined, -1: error. */
static int
request_keys(KeyTable *t, PyObject **r, Py_ssize_t count, PyObject *names, PyObject *prefixes,
             PyObject **tp, PyObject **u)
{
    Py_ssize_t need = (t->key_fields[0] > t->key_fields[1] ? t->key_fields[0]
                                                           : t->key_fields[1]);
    for (Py_ssize_t i = 0; i < count; i++) {
        if (!PyTuple_Check(r[i]) || need >= PyTuple_GET_SIZE(r[i])) {
            PyErr_SetString(PyExc_TypeError, NOT_TUPLE);
            return -1;
        }
        u[i] = PyTuple_GET_ITEM(r[i], t->key_fields[1]);
        if (u[i] == Py_None || (PyUnicode_CheckExact(u[i]) && !PyUnicode_GET_LENGTH(u[i])))
            return 0;  /* a message without a key: the caller goes message by message */
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        tp[i] = PyTuple_GET_ITEM(r[i], t->key_fields[0]);
        if (!PyUnicode_CheckExact(tp[i]) || !PyUnicode_CheckExact(u[i])) {
            PyErr_SetString(PyExc_TypeError, NOT_STR);
            return -1;
        }
        if (i && tp[i] == tp[i - 1])
            continue;  /* a put's requests mostly share one topic object */
        int found = exempt(tp[i], names, prefixes);
        if (found)
            return found < 0 ? -1 : 0;
    }
    return 1;
}

static PyObject *
KeyTable_add_requests(KeyTable *t, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyAnySet_Check(args[2]) || !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "add_requests(requests, keep_first, system_topics, system_prefixes)");
        return NULL;
    }
    if (t->key_fields[0] < 0) {
        PyErr_SetString(PyExc_ValueError, "KeyTable: built without key_fields");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[3]); i++) {
        if (!PyUnicode_Check(PyTuple_GET_ITEM(args[3], i))) {
            PyErr_SetString(PyExc_TypeError, NOT_STR);
            return NULL;
        }
    }
    int keep_first = PyObject_IsTrue(args[1]);
    PyObject *seq = keep_first < 0 ? NULL : PySequence_Fast(args[0], "requests: a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **r = PySequence_Fast_ITEMS(seq), *result = NULL;
    PyObject **keys = PyMem_Malloc((size_t)(count ? count : 1) * 2 * sizeof(PyObject *));
    if (!keys) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    int ok = count ? request_keys(t, r, count, args[2], args[3], keys, keys + count) : 0;
    if (ok > 0)  /* no Python code has run since the items were read: they are still held */
        result = add_keys(t, NULL, keys, keys + count, r, count, keep_first);
    else if (ok == 0)
        result = Py_NewRef(Py_False);
    PyMem_Free(keys);
    Py_DECREF(seq);
    return result;
}

static PyObject *
KeyTable_evict(KeyTable *t, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "evict(max_keys, cutoff_ms)");
        return NULL;
    }
    Py_ssize_t max_keys = PyLong_AsSsize_t(args[0]);
    if (max_keys == -1 && PyErr_Occurred())
        return NULL;
    long long cutoff_ms = PyLong_AsLongLong(args[1]);
    if (cutoff_ms == -1 && PyErr_Occurred())
        return NULL;
    while (t->live > max_keys) {  /* rule 5: the next nodes' slots prefetched */
        int32_t next[CHUNK];
        int k = 0;
        for (int32_t n = t->oldest; n >= 0 && k < CHUNK && k < t->live - max_keys;
             n = t->nodes[n].newer) {
            PREFETCH(&t->slots[(uint32_t)t->nodes[n].hash & t->mask]);
            next[k++] = n;
        }
        for (int i = 0; i < k; i++)
            remove_node(t, next[i]);
    }
    while (t->oldest >= 0 && t->nodes[t->oldest].f[F_STORE_MS] < cutoff_ms)
        remove_node(t, t->oldest);
    Py_RETURN_NONE;
}

static PyObject *
KeyTable_prune_from(KeyTable *t, PyObject *floor_obj)
{
    long long floor = PyLong_AsLongLong(floor_obj);
    if (floor == -1 && PyErr_Occurred())
        return NULL;
    while (t->newest >= 0 && t->nodes[t->newest].f[F_PHYS] >= floor)
        remove_node(t, t->newest);
    return PyLong_FromLongLong(floor - 1);
}

static PyObject *
KeyTable_items(KeyTable *t, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(t->live);
    if (!out)
        return NULL;
    Py_ssize_t i = 0;
    for (int32_t n = t->oldest; n >= 0; n = t->nodes[n].newer, i++) {
        node_t *x = &t->nodes[n];
        PyObject *uniq = uniq_of(x), *entry = uniq ? entry_of(x) : NULL;
        PyObject *item = entry ? Py_BuildValue("((OO)O)", x->topic, uniq, entry) : NULL;
        Py_XDECREF(uniq);
        Py_XDECREF(entry);
        if (!item) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

static PyObject *
KeyTable_capacity(KeyTable *t, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(t->cap);
}

static PyGetSetDef KeyTable_getset[] = {
    {"capacity", (getter)KeyTable_capacity, NULL, "keys the table holds before it grows", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef KeyTable_methods[] = {
    {"get", (PyCFunction)(void (*)(void))KeyTable_get, METH_FASTCALL,
     "get(topic, uniq): the entry held for the key (its five fields), or None."},
    {"holds_none", (PyCFunction)(void (*)(void))KeyTable_holds_none, METH_FASTCALL,
     "holds_none(topic, uniqs): True when none of uniqs is held under topic."},
    {"add", (PyCFunction)(void (*)(void))KeyTable_add, METH_FASTCALL,
     "add(topic, uniq, entry, keep_first=False): one key, young."},
    {"add_run", (PyCFunction)(void (*)(void))KeyTable_add_run, METH_FASTCALL,
     "add_run(topic, uniqs, entries, keep_first=False) -> bool: one topic's keys in order."},
    {"add_mixed", (PyCFunction)(void (*)(void))KeyTable_add_mixed, METH_FASTCALL,
     "add_mixed(topics, uniqs, entries, keep_first=False) -> bool: keys of many topics."},
    {"add_requests", (PyCFunction)(void (*)(void))KeyTable_add_requests, METH_FASTCALL,
     "add_requests(requests, keep_first, system_topics, system_prefixes) -> bool: a put's "
     "dispatch requests, in one pass; False (nothing changed) when a key is unset or a topic "
     "exempt."},
    {"evict", (PyCFunction)(void (*)(void))KeyTable_evict, METH_FASTCALL,
     "evict(max_keys, cutoff_ms): forget the oldest past max_keys and those stored before."},
    {"prune_from", (PyCFunction)KeyTable_prune_from, METH_O,
     "prune_from(floor) -> floor - 1: forget the newest keys whose record is at or past floor."},
    {"items", (PyCFunction)KeyTable_items, METH_NOARGS,
     "items() -> [((topic, uniq), entry)], oldest first."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods KeyTable_as_sequence = {
    .sq_length = (lenfunc)KeyTable_len,
};

static PyTypeObject KeyTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tidemq.node.sending._dedup_table.KeyTable",
    .tp_basicsize = sizeof(KeyTable),
    .tp_dealloc = (destructor)KeyTable_dealloc,
    .tp_as_sequence = &KeyTable_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "KeyTable(size, fields, key_fields=None, hash_bits=64): the duplicate window's "
              "keys; fields: where an added entry holds phys, size, queue id, queue offset and "
              "store ms; key_fields: where a dispatch request holds its topic and key.",
    .tp_methods = KeyTable_methods,
    .tp_getset = KeyTable_getset,
    .tp_new = KeyTable_new,
};

static struct PyModuleDef dedup_table_module = {
    PyModuleDef_HEAD_INIT, "_dedup_table", "The duplicate window's compiled key store.", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__dedup_table(void)
{
    if (PyType_Ready(&KeyTableType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&dedup_table_module);
    if (!m)
        return NULL;
    Py_INCREF(&KeyTableType);
    if (PyModule_AddObject(m, "KeyTable", (PyObject *)&KeyTableType) < 0) {
        Py_DECREF(&KeyTableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
