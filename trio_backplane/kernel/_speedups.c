/* C accelerator for the kernel: freeze (_frozen), put (_derived), the record copy (_evolve).
 *
 * configure(FrozenDict, FrozenList, LayeredDict, lineage_max) -> None
 * freeze(value, limit) -> frozen value | NotImplemented
 * copy_slots(obj) -> a new instance of type(obj) holding the same slot values
 * grown(items, more) -> a new FrozenList: the items of items, then of more
 * put(mapping, key, value, layer_from, overlay_max) -> derived | NotImplemented
 * configure_transition(...), transition(record, command, revision, ...) -> (new, [event]) | NotImplemented
 * register_record(cls, blank, fields, positional), record(cls, *args, **fields) -> cls(*args, **fields)
 * dumps(value) -> compact JSON text | NotImplemented
 *
 * freeze builds exactly what the Python walk builds for JSON data made of
 * exact built-in types (dict, list, tuple, str, int, float, bool, None) and
 * frozen containers: a new FrozenDict per dict (insertion order kept), a new
 * FrozenList per list or tuple, leaves and frozen containers as they are.
 * Anything else, and anything the walk refuses (a lone surrogate, a
 * non-finite float, an integer of more than 4300 digits, a container nested
 * at depth `limit` or deeper, a non-str key, any other type), returns
 * NotImplemented: the Python walk then decides and words the error, so the
 * accelerator never changes what is accepted or what an error says.
 *
 * Only exact built-in types are walked, so no Python code (no __eq__,
 * __hash__, __iter__ of the walked data) runs; the items being walked are
 * held by strong references all the same.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <structmember.h>

/* Deeper data goes to the Python walk, which does not recurse past a few
 * dozen levels: the C walk's own recursion stays small. */
#define C_DEPTH_MAX 200

/* 10**4300 has 14285 bits: an int of fewer bits has at most 4300 digits. */
#define INT_BITS_OK 14285

typedef struct kernel_spec kernel_spec;
typedef struct records records;
typedef struct head_spec head_spec;
typedef struct diff_spec diff_spec;

typedef struct {
    kernel_spec *kernel;  /* configure_transition's, or NULL */
    records *commands;    /* configure_commands', or NULL */
    records *records;     /* register_record's, or NULL */
    head_spec *head;      /* configure_head's, or NULL */
    diff_spec *diff;      /* configure_diff's, or NULL */
    /* commit_checked's types (held) and their slot offsets, found once */
    PyObject *check_record, *check_event;
    Py_ssize_t check_at[5];
    PyObject *frozen_dict;
    PyObject *frozen_list;
    PyObject *layered_dict;
    /* slot offsets: FrozenDict._lineage; LayeredDict's _base, _over, _len, _lineage */
    Py_ssize_t fd_lineage, ld_base, ld_over, ld_len, ld_lineage;
    Py_ssize_t lineage_max;
    /* the frozen types keep dict's and list's __new__ and __init__: made by
     * tp_new alone (their __init__ without arguments does nothing) */
    int plain_new;
} module_state;

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* A new empty FrozenDict / FrozenList, without a call through the type. */
static PyObject *
new_frozen(module_state *st, PyObject *type)
{
    if (!st->plain_new)
        return PyObject_CallNoArgs(type);
    PyTypeObject *t = (PyTypeObject *)type;
    PyObject *no_args = PyTuple_New(0);  /* the shared empty tuple */
    if (no_args == NULL)
        return NULL;
    PyObject *new = t->tp_new(t, no_args, NULL);
    Py_DECREF(no_args);
    return new;
}

/* The "let the Python walk decide" result, a borrowed NotImplemented. */
#define DECLINE Py_NotImplemented

/* Whether an exact str holds no lone surrogate (Python strs never pair them). */
static int
is_text(PyObject *s)
{
    if (PyUnicode_IS_ASCII(s))
        return 1;
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(s) < 0) {
        PyErr_Clear();
        return 0;
    }
#endif
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    const void *data = PyUnicode_DATA(s);
    switch (PyUnicode_KIND(s)) {
    case PyUnicode_1BYTE_KIND:
        return 1;
    case PyUnicode_2BYTE_KIND: {
        const Py_UCS2 *p = data;
        for (Py_ssize_t i = 0; i < n; i++)
            if (p[i] - 0xD800u < 0x800u)
                return 0;
        return 1;
    }
    default: {
        const Py_UCS4 *p = data;
        for (Py_ssize_t i = 0; i < n; i++)
            if (p[i] - 0xD800u < 0x800u)
                return 0;
        return 1;
    }
    }
}

static int
int_fits(PyObject *v)
{
    int overflow;
    (void)PyLong_AsLongLongAndOverflow(v, &overflow);
    if (!overflow)
        return 1;
    size_t bits = _PyLong_NumBits(v);
    if (bits == (size_t)-1) {
        PyErr_Clear();  /* the Python walk decides */
        return 0;
    }
    return bits < INT_BITS_OK;
}

/* Whether the cycle collector may skip v: an atom (no GC type) or a
 * container it does not track.  CPython's own rule for a tuple: a container
 * holding only such values is left untracked too, since no cycle can pass
 * through it (a dict re-tracks itself when a trackable value is set in it). */
static inline int
untracked(PyObject *v)
{
    return !PyObject_IS_GC(v) || !PyObject_GC_IsTracked(v);
}

/* A new reference to the frozen value; DECLINE (a new reference) to let
 * Python decide; NULL with an exception set on a real failure (memory). */
static PyObject *freeze_value(module_state *st, PyObject *v, int depth, int limit);

static PyObject *
freeze_dict(module_state *st, PyObject *v, int depth, int limit)
{
    PyObject *out = new_frozen(st, st->frozen_dict);
    if (out == NULL)
        return NULL;
    Py_ssize_t pos = 0;
    PyObject *key, *item;
    int atoms = 1;
    while (PyDict_Next(v, &pos, &key, &item)) {
        if (!PyUnicode_CheckExact(key) || !is_text(key))
            goto decline;
        Py_INCREF(key);
        Py_INCREF(item);
        PyObject *frozen = freeze_value(st, item, depth + 1, limit);
        Py_DECREF(item);
        if (frozen == NULL || frozen == DECLINE) {
            Py_DECREF(key);
            Py_DECREF(out);
            return frozen;
        }
        atoms = atoms && untracked(frozen);
        int failed = PyDict_SetItem(out, key, frozen);
        Py_DECREF(key);
        Py_DECREF(frozen);
        if (failed) {
            Py_DECREF(out);
            return NULL;
        }
    }
    if (atoms)
        PyObject_GC_UnTrack(out);
    return out;
decline:
    Py_DECREF(out);
    return Py_NewRef(DECLINE);
}

static PyObject *
freeze_sequence(module_state *st, PyObject *v, int depth, int limit)
{
    PyObject *out = new_frozen(st, st->frozen_list);
    if (out == NULL)
        return NULL;
    /* a list's size is read at each item: nothing here can change it, but
     * the walk never reads past its end whatever happens */
    int atoms = 1;
    for (Py_ssize_t i = 0; i < Py_SIZE(v); i++) {
        PyObject *item = PyList_CheckExact(v) ? PyList_GET_ITEM(v, i) : PyTuple_GET_ITEM(v, i);
        Py_INCREF(item);
        PyObject *frozen = freeze_value(st, item, depth + 1, limit);
        Py_DECREF(item);
        if (frozen == NULL || frozen == DECLINE) {
            Py_DECREF(out);
            return frozen;
        }
        atoms = atoms && untracked(frozen);
        int failed = PyList_Append(out, frozen);
        Py_DECREF(frozen);
        if (failed) {
            Py_DECREF(out);
            return NULL;
        }
    }
    if (atoms)
        PyObject_GC_UnTrack(out);
    return out;
}

static PyObject *
freeze_value(module_state *st, PyObject *v, int depth, int limit)
{
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyUnicode_Type)
        return Py_NewRef(is_text(v) ? v : DECLINE);
    if (t == &PyLong_Type)
        return Py_NewRef(int_fits(v) ? v : DECLINE);
    if (t == &PyFloat_Type)
        return Py_NewRef(isfinite(PyFloat_AS_DOUBLE(v)) ? v : DECLINE);
    if (v == Py_None || t == &PyBool_Type || (PyObject *)t == st->frozen_list)
        return Py_NewRef(v);
    if ((PyObject *)t == st->frozen_dict || (PyObject *)t == st->layered_dict)
        /* kept; the Python walk refuses a mapping past the limit */
        return Py_NewRef(depth < limit ? v : DECLINE);
    if (t != &PyDict_Type && t != &PyList_Type && t != &PyTuple_Type)
        return Py_NewRef(DECLINE);
    if (depth >= limit || depth >= C_DEPTH_MAX)
        return Py_NewRef(DECLINE);  /* too deep: the Python walk decides */
    if (Py_EnterRecursiveCall(" in freeze")) {
        PyErr_Clear();  /* near the interpreter's limit: the Python walk decides */
        return Py_NewRef(DECLINE);
    }
    PyObject *out = t == &PyDict_Type ? freeze_dict(st, v, depth, limit)
                                      : freeze_sequence(st, v, depth, limit);
    Py_LeaveRecursiveCall();
    return out;
}

/* The state of a configured module called with `expected` arguments, or
 * NULL with TypeError / RuntimeError set (`signature` names the call). */
static module_state *
called(PyObject *module, Py_ssize_t nargs, Py_ssize_t expected, const char *signature)
{
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", signature, expected);
        return NULL;
    }
    module_state *st = PyModule_GetState(module);
    if (st->frozen_dict == NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s: configure() was not called", signature);
        return NULL;
    }
    return st;
}

static PyObject *
freeze(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *st = called(module, nargs, 2, "freeze(value, limit)");
    if (st == NULL)
        return NULL;
    /* a limit this walk does not take (not an int, negative, huge): the
     * Python walk decides */
    if (!PyLong_CheckExact(args[1]))
        return Py_NewRef(DECLINE);
    int overflow;
    long limit = PyLong_AsLongAndOverflow(args[1], &overflow);
    if (overflow || limit < 0 || limit > 100000)
        return Py_NewRef(DECLINE);
    return freeze_value(st, args[0], 0, (int)limit);
}

/* The read-only Py_ssize_t members a C type may list for its weakref and
 * dict offsets (__weaklistoffset__, __dictoffset__): not slots. */
static int
is_offset_marker(PyMemberDef *m)
{
    return m->type == T_PYSSIZET && (m->flags & READONLY);
}

/* Whether copy_slots copies all of an instance of t: t and every base but
 * object are classes a class statement made with __slots__ (no __dict__, no
 * variable size, no C base whose state tp_alloc would leave zeroed), and
 * every member is a slot. */
static int
slots_only(PyTypeObject *t)
{
    if (t->tp_dictoffset != 0 || (t->tp_flags & Py_TPFLAGS_IS_ABSTRACT))
        return 0;
    for (PyTypeObject *b = t; b != &PyBaseObject_Type; b = b->tp_base) {
        if (b == NULL || !(b->tp_flags & Py_TPFLAGS_HEAPTYPE) || b->tp_itemsize != 0
            || ((PyHeapTypeObject *)b)->ht_slots == NULL)
            return 0;
        for (PyMemberDef *m = b->tp_members; m != NULL && m->name != NULL; m++)
            if (m->type != T_OBJECT_EX && !is_offset_marker(m))
                return 0;
    }
    return 1;
}

/* copy_slots: for the kernel's records (attrs slotted classes): a blank
 * instance of the same type with every __slots__ member (of the type and
 * its bases) pointing at the same value; no __init__, converter or
 * validator runs, as the Python copy it replaces.  Any other type is
 * refused (TypeError): its state would not all be copied. */
static PyObject *slot_copy(PyObject *obj);

static PyObject *
copy_slots(PyObject *module, PyObject *obj)
{
    if (!slots_only(Py_TYPE(obj))) {
        PyErr_SetString(PyExc_TypeError,
                        "copy_slots: only classes with __slots__ over object (no __dict__)");
        return NULL;
    }
    return slot_copy(obj);
}

/* copy_slots of an object of a type slots_only accepted. */
static PyObject *
slot_copy(PyObject *obj)
{
    PyTypeObject *t = Py_TYPE(obj);
    Py_INCREF(t);  /* held across the allocation, which may run a finalizer */
    PyObject *new = t->tp_alloc(t, 0);
    if (new != NULL)
        for (PyTypeObject *b = t; b != &PyBaseObject_Type; b = b->tp_base)
            for (PyMemberDef *m = b->tp_members; m != NULL && m->name != NULL; m++) {
                if (is_offset_marker(m))
                    continue;
                PyObject *value = *(PyObject **)((char *)obj + m->offset);
                *(PyObject **)((char *)new + m->offset) = Py_XNewRef(value);
            }
    Py_DECREF(t);
    return new;
}

/* grown: the kernel's append to a growing field (the transcript, the usage
 * reports), one copy at C speed: list(items) of a list subclass goes item by
 * item through an iterator.  The result is left untracked by the cycle
 * collector when every item is (see untracked): a long transcript copied at
 * every commit is then not walked by every young collection.  Messages the
 * kernel froze are untracked; one holding a mutable value keeps the copy
 * tracked. */
static PyObject *grown_impl(module_state *st, PyObject *items, PyObject *more);

static PyObject *
grown(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *st = called(module, nargs, 2, "grown(items, more)");
    if (st == NULL)
        return NULL;
    return grown_impl(st, args[0], args[1]);
}

static PyObject *
grown_impl(module_state *st, PyObject *items, PyObject *more)
{
    if (!(PyList_Check(items) || PyTuple_Check(items)) || !(PyList_Check(more) || PyTuple_Check(more))) {
        PyErr_SetString(PyExc_TypeError, "grown: items and more must be lists or tuples");
        return NULL;
    }
    /* The new list first: an object allocation may run a collection (and a
     * finalizer); the sizes and item arrays are read after it, and nothing
     * between reading and copying them runs Python code. */
    PyObject *out = new_frozen(st, st->frozen_list);
    if (out == NULL)
        return NULL;
    if (!PyList_Check(out) || Py_SIZE(out) != 0) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_TypeError, "grown: the configured list type made no empty list");
        return NULL;
    }
    Py_ssize_t n = Py_SIZE(items), m = Py_SIZE(more);
    PyObject **a = PyList_Check(items) ? ((PyListObject *)items)->ob_item : ((PyTupleObject *)items)->ob_item;
    PyObject **b = PyList_Check(more) ? ((PyListObject *)more)->ob_item : ((PyTupleObject *)more)->ob_item;
    PyListObject *list = (PyListObject *)out;
    PyObject **slots = PyMem_New(PyObject *, n + m > 0 ? n + m : 1);
    if (slots == NULL) {
        Py_DECREF(out);
        return PyErr_NoMemory();
    }
    /* An untracked FrozenList is one this function (or freeze) left
     * untracked: its items were found untracked then and are not looked at
     * again (a frozen list is not appended to). */
    int atoms = 1;
    if ((PyObject *)Py_TYPE(items) == st->frozen_list && !PyObject_GC_IsTracked(items)) {
        for (Py_ssize_t i = 0; i < n; i++)
            slots[i] = Py_NewRef(a[i]);
    }
    else {
        for (Py_ssize_t i = 0; i < n; i++) {
            atoms = atoms && untracked(a[i]);
            slots[i] = Py_NewRef(a[i]);
        }
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        atoms = atoms && untracked(b[i]);
        slots[n + i] = Py_NewRef(b[i]);
    }
    PyMem_Free(list->ob_item);  /* an empty list's (NULL) */
    list->ob_item = slots;
    Py_SET_SIZE(list, n + m);
    list->allocated = n + m > 0 ? n + m : 1;
    if (atoms)
        PyObject_GC_UnTrack(out);
    return out;
}

/* A new LayeredDict of base, over and length, slot by slot (its __init__
 * sets exactly these three). */
static PyObject *
make_layered(module_state *st, PyObject *base, PyObject *over, Py_ssize_t length)
{
    PyTypeObject *t = (PyTypeObject *)st->layered_dict;
    PyObject *size = PyLong_FromSsize_t(length);
    if (size == NULL)
        return NULL;
    PyObject *new = t->tp_alloc(t, 0);
    if (new == NULL) {
        Py_DECREF(size);
        return NULL;
    }
    SLOT(new, st->ld_base) = Py_NewRef(base);
    SLOT(new, st->ld_over) = Py_NewRef(over);
    SLOT(new, st->ld_len) = size;
    return new;
}

/* The lineage tuple (log, version) of a derived mapping, or NULL when unset;
 * *bad is set for anything else (a value put there by hand). */
static PyObject *
lineage_of(PyObject *mapping, Py_ssize_t offset, int *bad)
{
    PyObject *lineage = SLOT(mapping, offset);
    if (lineage == NULL)
        return NULL;
    if (!(PyTuple_CheckExact(lineage) && PyTuple_GET_SIZE(lineage) == 2
          && PyList_CheckExact(PyTuple_GET_ITEM(lineage, 0))
          && PyLong_CheckExact(PyTuple_GET_ITEM(lineage, 1))))
        *bad = 1;
    else if (PyLong_AsSsize_t(PyTuple_GET_ITEM(lineage, 1)) == -1 && PyErr_Occurred()) {
        PyErr_Clear();  /* a version no log reaches: the Python code decides */
        *bad = 1;
    }
    return lineage;
}

static int
set_lineage(PyObject *mapping, Py_ssize_t offset, PyObject *log, Py_ssize_t version)
{
    PyObject *lineage = Py_BuildValue("(On)", log, version);
    if (lineage == NULL)
        return -1;
    Py_XSETREF(SLOT(mapping, offset), lineage);
    return 0;
}

/* new, with the lineage of a derivation from mapping (_derive): the old
 * mapping's log extended when it is the newest version of it, a log rooted
 * at a non-empty mapping that has none, else a new branch.  Steals new;
 * lineage is mapping's (a strong reference, or NULL). */
static PyObject *
with_lineage(module_state *st, PyObject *mapping, Py_ssize_t lineage_at, PyObject *lineage,
             Py_ssize_t old_len, PyObject *key, PyObject *new)
{
    Py_ssize_t new_at = (PyObject *)Py_TYPE(new) == st->layered_dict ? st->ld_lineage : st->fd_lineage;
    PyObject *log = NULL;
    Py_ssize_t version = 0;
    if (lineage == NULL && old_len > 0) {
        log = PyList_New(0);  /* rooted at the old mapping, version 0 */
        if (log == NULL || set_lineage(mapping, lineage_at, log, 0) < 0)
            goto failed;
    }
    else if (lineage != NULL) {
        log = Py_NewRef(PyTuple_GET_ITEM(lineage, 0));
        version = PyLong_AsSsize_t(PyTuple_GET_ITEM(lineage, 1));
        if (version == -1 && PyErr_Occurred())
            goto failed;
    }
    if (log != NULL && version == PyList_GET_SIZE(log) && version < st->lineage_max) {
        if (PyList_Append(log, key) < 0 || set_lineage(new, new_at, log, version + 1) < 0)
            goto failed;
        Py_DECREF(log);
        return new;
    }
    Py_XSETREF(log, PyList_New(1));  /* a branch: a new log */
    if (log == NULL)
        goto failed;
    PyList_SET_ITEM(log, 0, Py_NewRef(key));
    if (set_lineage(new, new_at, log, 1) < 0)
        goto failed;
    Py_DECREF(log);
    return new;
failed:
    Py_XDECREF(log);
    Py_DECREF(new);
    return NULL;
}

/* A LayeredDict's layers as its class sets them (borrowed) and its length;
 * 0 for a layout set by hand, which the Python code decides about. */
static int
layers_of(module_state *st, PyObject *m, PyObject **base, PyObject **over, Py_ssize_t *length)
{
    PyObject *size = SLOT(m, st->ld_len);
    *base = SLOT(m, st->ld_base);
    *over = SLOT(m, st->ld_over);
    if (*base == NULL || *over == NULL || size == NULL || !PyDict_CheckExact(*over)
        || (PyObject *)Py_TYPE(*base) != st->frozen_dict || !PyLong_CheckExact(size))
        return 0;
    *length = PyLong_AsSsize_t(size);
    if (*length == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* The derived mapping of _derived.put (its _set then its _derive, exactly),
 * for a FrozenDict or a LayeredDict and a str key; NotImplemented for
 * anything else (the Python code decides).  The mapping's parts are held
 * by strong references while the new one is built. */
static PyObject *
derive_put(module_state *st, PyObject *mapping, PyObject *key, PyObject *value,
           Py_ssize_t layer_from, Py_ssize_t overlay_max)
{
    PyObject *t = (PyObject *)Py_TYPE(mapping);
    int layered = t == st->layered_dict;
    if ((!layered && t != st->frozen_dict) || !PyUnicode_CheckExact(key))
        return Py_NewRef(DECLINE);
    int bad = 0;
    Py_ssize_t lineage_at = layered ? st->ld_lineage : st->fd_lineage;
    PyObject *lineage = lineage_of(mapping, lineage_at, &bad);
    if (bad)
        return Py_NewRef(DECLINE);
    PyObject *new = NULL, *over = NULL, *base = NULL, *grown = NULL;
    Py_ssize_t old_len;
    Py_XINCREF(lineage);
    if (layered) {
        if (!layers_of(st, mapping, &base, &over, &old_len)) {
            Py_XDECREF(lineage);
            return Py_NewRef(DECLINE);
        }
        Py_INCREF(base);
        Py_INCREF(over);
        int in_over = PyDict_Contains(over, key);
        if (in_over < 0)
            goto done;
        if (PyDict_GET_SIZE(over) < overlay_max || in_over) {
            int in_base = in_over ? 1 : PyDict_Contains(base, key);
            if (in_base < 0)
                goto done;
            grown = PyDict_Copy(over);
            if (grown == NULL || PyDict_SetItem(grown, key, value) < 0)
                goto done;
            new = make_layered(st, base, grown, in_base ? old_len : old_len + 1);
        }
        else {
            new = new_frozen(st, st->frozen_dict);
            if (new != NULL && (PyDict_Update(new, base) < 0 || PyDict_Update(new, over) < 0
                                || PyDict_SetItem(new, key, value) < 0))
                Py_CLEAR(new);
        }
    }
    else {
        old_len = PyDict_GET_SIZE(mapping);
        if (old_len >= layer_from) {
            int in_mapping = PyDict_Contains(mapping, key);
            if (in_mapping < 0)
                goto done;
            grown = PyDict_New();
            if (grown == NULL || PyDict_SetItem(grown, key, value) < 0)
                goto done;
            new = make_layered(st, mapping, grown, in_mapping ? old_len : old_len + 1);
        }
        else {
            new = new_frozen(st, st->frozen_dict);
            if (new != NULL && (PyDict_Update(new, mapping) < 0
                                || PyDict_SetItem(new, key, value) < 0))
                Py_CLEAR(new);
        }
    }
    if (new != NULL)
        new = with_lineage(st, mapping, lineage_at, lineage, old_len, key, new);
done:
    Py_XDECREF(grown);
    Py_XDECREF(base);
    Py_XDECREF(over);
    Py_XDECREF(lineage);
    return new;
}

static PyObject *
put(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *st = called(module, nargs, 5, "put(mapping, key, value, layer_from, overlay_max)");
    if (st == NULL)
        return NULL;
    Py_ssize_t layer_from = PyLong_AsSsize_t(args[3]);
    if (layer_from == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t overlay_max = PyLong_AsSsize_t(args[4]);
    if (overlay_max == -1 && PyErr_Occurred())
        return NULL;
    return derive_put(st, args[0], args[1], args[2], layer_from, overlay_max);
}

/* The offset of the __slots__ member `name` of type t, or -1. */
static Py_ssize_t
slot_offset(PyObject *t, const char *name)
{
    for (PyMemberDef *m = ((PyTypeObject *)t)->tp_members; m != NULL && m->name != NULL; m++)
        if (m->type == T_OBJECT_EX && strcmp(m->name, name) == 0)
            return m->offset;
    return -1;
}

static PyObject *
configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "configure takes the three frozen types and the lineage limit");
        return NULL;
    }
    for (int i = 0; i < 3; i++)
        if (!PyType_Check(args[i])) {
            PyErr_SetString(PyExc_TypeError, "configure takes types");
            return NULL;
        }
    if (!PyType_IsSubtype((PyTypeObject *)args[0], &PyDict_Type)
        || !PyType_IsSubtype((PyTypeObject *)args[1], &PyList_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure: a dict and a list subclass first");
        return NULL;
    }
    Py_ssize_t lineage_max = PyLong_AsSsize_t(args[3]);
    if (lineage_max == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t fd_lineage = slot_offset(args[0], "_lineage");
    Py_ssize_t ld_base = slot_offset(args[2], "_base"), ld_over = slot_offset(args[2], "_over");
    Py_ssize_t ld_len = slot_offset(args[2], "_len"), ld_lineage = slot_offset(args[2], "_lineage");
    if (fd_lineage < 0 || ld_base < 0 || ld_over < 0 || ld_len < 0 || ld_lineage < 0) {
        PyErr_SetString(PyExc_TypeError, "configure: the frozen types lack their slots");
        return NULL;
    }
    module_state *st = PyModule_GetState(module);
    Py_XSETREF(st->frozen_dict, Py_NewRef(args[0]));
    Py_XSETREF(st->frozen_list, Py_NewRef(args[1]));
    Py_XSETREF(st->layered_dict, Py_NewRef(args[2]));
    st->fd_lineage = fd_lineage;
    st->ld_base = ld_base;
    st->ld_over = ld_over;
    st->ld_len = ld_len;
    st->ld_lineage = ld_lineage;
    st->lineage_max = lineage_max;
    PyTypeObject *fd = (PyTypeObject *)args[0], *fl = (PyTypeObject *)args[1];
    st->plain_new = fd->tp_new == PyDict_Type.tp_new && fd->tp_init == PyDict_Type.tp_init
                    && fl->tp_new == PyList_Type.tp_new && fl->tp_init == PyList_Type.tp_init;
    Py_RETURN_NONE;
}

/* ---- transition: the kernel's four hot commands -------------------------
 *
 * transition(record, command, revision, layer_from, overlay_max)
 *     -> (new record, [event]) | NotImplemented
 *
 * What _transition.transition builds for provider_started,
 * provider_completed, tool_invoked and tool_completed on a running record,
 * field for field, lineage included, when every value is of the exact types
 * the kernel builds.  Anything else (another command, a generic command's
 * typed form, a refusal of any kind, a value of another type, the final
 * response, the first tool of a run) returns NotImplemented and the Python
 * transition decides: it stays the reference and words every error. */

enum { K_PROVIDER_STARTED, K_PROVIDER_COMPLETED, K_TOOL_INVOKED, K_TOOL_COMPLETED, N_KINDS };
static const char *const EVENT_TYPES[N_KINDS] = {
    "run.provider_started", "run.provider_completed", "run.tool_invoked", "run.tool_completed",
};

/* The command fields the handlers read. */
enum {
    F_AT, F_RUN_ID, F_INCARNATION, F_SOURCE, F_TURN_ID, F_ATTEMPT_ID, F_RESULT, F_FINAL,
    F_CONVERSATION, F_MESSAGES, F_USAGE, F_STEP_ID, F_TOOL_NAME, F_TOOL_REVISION,
    F_TOOL_CALL_ID, F_ARGUMENTS_DIGEST, F_EFFECTIVE_AUTHORITY, F_EFFECT_CLASS,
    F_DISPATCH_STATE, F_INVOCATION_ID, N_FIELDS
};
static const char *const FIELD_NAMES[N_FIELDS] = {
    "at", "run_id", "incarnation", "_source", "turn_id", "attempt_id", "result", "final",
    "conversation", "messages", "usage", "step_id", "tool_name", "tool_revision",
    "tool_call_id", "arguments_digest", "effective_authority", "effect_class",
    "dispatch_state", "invocation_id",
};

/* The record's, budget's and event's slots. */
enum {
    R_RUN_ID, R_INCARNATION, R_REVISION, R_STATE, R_DEADLINE, R_BUDGET, R_STEP_ID,
    R_COUNTERS, R_ACTIVE_PROVIDER, R_ACTIVE_TOOLS, R_INTENTS, R_TOOL_RESULTS,
    R_PROVIDER_RESULT, R_ACTIVE_WAIT, R_CONTEXT, R_TRANSCRIPT, R_USAGE, N_RECORD
};
static const char *const RECORD_NAMES[N_RECORD] = {
    "run_id", "incarnation", "revision", "state", "deadline", "budget", "step_id",
    "counters", "active_provider", "active_tools", "intents", "tool_results",
    "provider_result", "active_wait", "context", "transcript", "usage",
};
enum { B_QUOTA, B_USED, B_RESERVATIONS, N_BUDGET };
static const char *const BUDGET_NAMES[N_BUDGET] = {"quota", "used", "reservations"};
enum { E_TYPE, E_AT, E_PAYLOAD, E_SEQUENCE, N_EVENT };
static const char *const EVENT_NAMES[N_EVENT] = {"type", "occurred_at", "payload", "sequence"};

/* The strings the handlers write (interned once). */
enum {
    S_RUNNING, S_KIND, S_STATUS, S_EFFECT_CLASS, S_DISPATCH_STATE, S_ATTEMPT_ID, S_STEP_ID,
    S_STARTED_AT, S_TURN_ID, S_COMPLETED_AT, S_RESULT, S_INVOCATION_ID, S_CONVERSATION,
    S_PROVIDER, S_STARTED, S_READ_ONLY, S_UNKNOWN, S_CONSUMED, S_TOOL, S_MUTATION,
    S_ATTEMPT, S_STEP, S_INVOCATION, S_STATE, S_INPUT, S_MESSAGES,
    S_TOOL_NAME, S_TOOL_REVISION, S_TOOL_CALL_ID, S_ARGUMENTS_DIGEST,
    S_EFFECTIVE_AUTHORITY, S_KEYS, S_ITEMS, S_TYPE, N_STRINGS
};
static const char *const STRINGS[N_STRINGS] = {
    "running", "kind", "status", "effect_class", "dispatch_state", "attempt_id", "step_id",
    "started_at", "turn_id", "completed_at", "result", "invocation_id", "conversation",
    "provider", "started", "read_only", "unknown", "consumed", "tool", "mutation",
    "attempt", "step", "invocation", "state", "input", "messages",
    "tool_name", "tool_revision", "tool_call_id", "arguments_digest",
    "effective_authority", "keys", "items", "type",
};

#define MAX_INPUTS 16

typedef struct {
    PyObject *type;        /* the command's class */
    PyObject *event_type;  /* "run.<kind>" */
    Py_ssize_t field[N_FIELDS];          /* slot offsets, -1 where it has none */
    Py_ssize_t n_input;                  /* its input fields, in order */
    PyObject *input_name[MAX_INPUTS];
    Py_ssize_t input_at[MAX_INPUTS];
    int digested[MAX_INPUTS];
} command_spec;

struct kernel_spec {
    PyObject *record_type, *budget_type, *event_proto, *unset;
    PyObject *key_summaries, *item_summaries;
    int max_depth, record_depth;
    Py_ssize_t record[N_RECORD], budget[N_BUDGET], event[N_EVENT];
    PyObject *s[N_STRINGS];
    command_spec kinds[N_KINDS];
};

/* The offset of the slot `name` of t or a base of it, or -1. */
static Py_ssize_t
slot_offset_in(PyObject *t, const char *name)
{
    for (PyTypeObject *b = (PyTypeObject *)t; b != NULL && b != &PyBaseObject_Type; b = b->tp_base) {
        Py_ssize_t at = slot_offset((PyObject *)b, name);
        if (at >= 0)
            return at;
    }
    return -1;
}

/* The changes to the copied record: slots and new values (owned).  A
 * handler makes at most six. */
#define MAX_CHANGES 8
typedef struct {
    Py_ssize_t at[MAX_CHANGES];
    PyObject *value[MAX_CHANGES];
    int n;
} changes;

static void
changes_clear(changes *c)
{
    for (int i = 0; i < c->n; i++)
        Py_CLEAR(c->value[i]);
    c->n = 0;
}

/* Steals value (NULL: a failure already set); -1 on failure. */
static int
change(changes *c, Py_ssize_t at, PyObject *value)
{
    if (value == NULL)
        return -1;
    if (c->n == MAX_CHANGES) {
        Py_DECREF(value);
        PyErr_SetString(PyExc_SystemError, "transition: too many changes");
        return -1;
    }
    c->at[c->n] = at;
    c->value[c->n++] = value;
    return 0;
}

/* The outcome of a step below: done, declined (Python decides), or failed
 * (an exception is set). */
enum { OK = 0, NO = 1, FAIL = -1 };

/* The value of key (an exact str) in a FrozenDict or LayeredDict, a new
 * reference, or NULL when it has none; *how is NO for another type or
 * layout, FAIL with an exception set.  The layers are held while read. */
static PyObject *
lookup(module_state *st, PyObject *m, PyObject *key, int *how)
{
    PyObject *t = (PyObject *)Py_TYPE(m);
    PyObject *v = NULL;
    *how = OK;
    if (t == st->frozen_dict) {
        Py_INCREF(m);
        v = Py_XNewRef(PyDict_GetItemWithError(m, key));
        Py_DECREF(m);
    }
    else if (t == st->layered_dict) {
        PyObject *base, *over;
        Py_ssize_t length;
        if (!layers_of(st, m, &base, &over, &length)) {
            *how = NO;
            return NULL;
        }
        Py_INCREF(base);
        Py_INCREF(over);
        v = Py_XNewRef(PyDict_GetItemWithError(over, key));
        if (v == NULL && !PyErr_Occurred())
            v = Py_XNewRef(PyDict_GetItemWithError(base, key));
        Py_DECREF(over);
        Py_DECREF(base);
    }
    else {
        *how = NO;
        return NULL;
    }
    if (v == NULL && PyErr_Occurred())
        *how = FAIL;
    return v;
}

/* Whether key is in m: OK when it is not, NO when it is or m is not a
 * frozen mapping, FAIL. */
static int
absent(module_state *st, PyObject *m, PyObject *key)
{
    int how;
    PyObject *v = lookup(st, m, key, &how);
    if (v != NULL) {
        Py_DECREF(v);
        return NO;
    }
    return how;
}

/* _derived.put(mapping, key, value) at C speed: a new reference, DECLINE
 * (new) or NULL.  Steals value. */
static PyObject *
put_stealing(module_state *st, PyObject *mapping, PyObject *key, PyObject *value,
             Py_ssize_t layer_from, Py_ssize_t overlay_max)
{
    if (value == NULL)
        return NULL;
    PyObject *out = derive_put(st, mapping, key, value, layer_from, overlay_max);
    Py_DECREF(value);
    return out;
}

/* A non-negative counter of the record's (0 when missing), or -1 (NO). */
static long long
counter(PyObject *counters, PyObject *name)
{
    PyObject *n = PyDict_GetItemWithError(counters, name);
    if (n == NULL)
        return PyErr_Occurred() ? (PyErr_Clear(), -1) : 0;
    if (!PyLong_CheckExact(n))
        return -1;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(n, &overflow);
    return overflow || v < 0 || v >= LLONG_MAX - 1 ? -1 : v;
}

/* new_counters[name] = n + 1 and the id "<name>-<incarnation>-<n + 1>" (new). */
static PyObject *
next_id(PyObject *new_counters, PyObject *name, long long n, long long incarnation)
{
    PyObject *count = PyLong_FromLongLong(n + 1);
    if (count == NULL)
        return NULL;
    int failed = PyDict_SetItem(new_counters, name, count);
    Py_DECREF(count);
    if (failed)
        return NULL;
    return PyUnicode_FromFormat("%U-%lld-%lld", name, incarnation, n + 1);
}

/* FrozenList(sorted(keys)[:32]) of a tuple of exact strs (new). */
static PyObject *
sorted_keys(module_state *st, PyObject *keys)
{
    PyObject *listed = PySequence_List(keys);
    if (listed == NULL || PyList_Sort(listed) < 0) {
        Py_XDECREF(listed);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(listed) < 32 ? PyList_GET_SIZE(listed) : 32;
    PyObject *head = PyList_GetSlice(listed, 0, n);
    Py_DECREF(listed);
    if (head == NULL)
        return NULL;
    PyObject *out = new_frozen(st, st->frozen_list);
    if (out != NULL && PyList_SetSlice(out, 0, 0, head) < 0)
        Py_CLEAR(out);
    Py_DECREF(head);
    return out;
}

/* A FrozenDict of one or two entries (values stolen; NULL: failed). */
static PyObject *
frozen_pair(module_state *st, PyObject *k1, PyObject *v1, PyObject *k2, PyObject *v2)
{
    PyObject *d = v1 == NULL || (k2 != NULL && v2 == NULL) ? NULL : new_frozen(st, st->frozen_dict);
    if (d != NULL && (PyDict_SetItem(d, k1, v1) < 0 || (k2 != NULL && PyDict_SetItem(d, k2, v2) < 0)))
        Py_CLEAR(d);
    Py_XDECREF(v1);
    Py_XDECREF(v2);
    return d;
}

/* What an event says of a large input (_commands._summary), for a FrozenDict
 * or dict of exact str keys, a FrozenList, an exact list or tuple; DECLINE (new)
 * for anything else, so no Python code runs (no __len__, __iter__, __eq__
 * or __hash__ of a subclass).  The summary of a key set is shared through
 * the Python function's cache, filled as it fills it. */
static PyObject *
summarize(module_state *st, kernel_spec *k, PyObject *v)
{
    PyObject *t = (PyObject *)Py_TYPE(v);
    if (t == st->frozen_list || t == (PyObject *)&PyList_Type || t == (PyObject *)&PyTuple_Type) {
        Py_ssize_t n = Py_SIZE(v);
        if (n < PyTuple_GET_SIZE(k->item_summaries))
            return Py_NewRef(PyTuple_GET_ITEM(k->item_summaries, n));
        return frozen_pair(st, k->s[S_ITEMS], PyLong_FromSsize_t(n), NULL, NULL);
    }
    if (v == Py_None || t == (PyObject *)&PyBool_Type || t == (PyObject *)&PyLong_Type
        || t == (PyObject *)&PyFloat_Type || t == (PyObject *)&PyUnicode_Type)
        return frozen_pair(st, k->s[S_TYPE], PyType_GetName((PyTypeObject *)t), NULL, NULL);
    if (t != st->frozen_dict && t != (PyObject *)&PyDict_Type)
        return Py_NewRef(DECLINE);
    PyObject *keys = PyTuple_New(PyDict_GET_SIZE(v));
    if (keys == NULL)
        return NULL;
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *item;
    while (PyDict_Next(v, &pos, &key, &item)) {
        if (!PyUnicode_CheckExact(key) || i >= PyTuple_GET_SIZE(keys)) {
            Py_DECREF(keys);
            return Py_NewRef(DECLINE);
        }
        PyTuple_SET_ITEM(keys, i++, Py_NewRef(key));
    }
    PyObject *out = NULL;
    PyObject *messages = PyDict_GetItemWithError(v, k->s[S_MESSAGES]);
    if (messages == NULL && PyErr_Occurred())
        goto done;
    if (messages != NULL && (PyList_Check(messages) || PyTuple_Check(messages))) {
        PyObject *mt = (PyObject *)Py_TYPE(messages);
        if (mt != st->frozen_list && mt != (PyObject *)&PyList_Type && mt != (PyObject *)&PyTuple_Type)
            out = Py_NewRef(DECLINE);  /* a subclass's len() may be its own */
        else
            out = frozen_pair(st, k->s[S_KEYS], sorted_keys(st, keys), k->s[S_MESSAGES],
                              PyLong_FromSsize_t(Py_SIZE(messages)));
        goto done;
    }
    out = Py_XNewRef(PyDict_GetItemWithError(k->key_summaries, keys));
    if (out != NULL || PyErr_Occurred())
        goto done;
    out = frozen_pair(st, k->s[S_KEYS], sorted_keys(st, keys), NULL, NULL);
    if (out != NULL && PyDict_GET_SIZE(k->key_summaries) < 256
        && PyDict_SetItem(k->key_summaries, keys, out) < 0)
        Py_CLEAR(out);
done:
    Py_DECREF(keys);
    return out;
}

/* A value as a record or an event keeps it: frozen already or a leaf needing
 * no check as it is, else frozen at C speed (new; DECLINE or NULL). */
static PyObject *
checked_value(module_state *st, PyObject *v, int limit)
{
    PyObject *t = (PyObject *)Py_TYPE(v);
    if (v == Py_None || t == (PyObject *)&PyBool_Type || t == st->frozen_dict
        || t == st->frozen_list || t == st->layered_dict)
        return Py_NewRef(v);
    return freeze_value(st, v, 0, limit);
}

/* The command's event input (_commands.event_input of a typed command). */
static PyObject *
event_input_of(module_state *st, kernel_spec *k, command_spec *c, PyObject *command)
{
    PyObject *given = new_frozen(st, st->frozen_dict);
    if (given == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < c->n_input; i++) {
        PyObject *v = SLOT(command, c->input_at[i]);
        if (v == NULL) {
            Py_DECREF(given);
            return Py_NewRef(DECLINE);
        }
        if (v == k->unset)
            continue;
        /* (no Python code runs below: the slot's value stays alive) */
        PyObject *shown;
        if (c->digested[i])
            shown = summarize(st, k, v);
        else if (PyUnicode_CheckExact(v) && PyUnicode_IS_ASCII(v))
            shown = Py_NewRef(v);
        else
            shown = checked_value(st, v, k->max_depth);
        if (shown == NULL || shown == DECLINE) {
            Py_DECREF(given);
            return shown;
        }
        int failed = PyDict_SetItem(given, c->input_name[i], shown);
        Py_DECREF(shown);
        if (failed) {
            Py_DECREF(given);
            return NULL;
        }
    }
    return given;
}

/* A new FrozenDict of n (key, value) pairs, values borrowed. */
static PyObject *
frozen_of(module_state *st, int n, PyObject **pairs)
{
    PyObject *d = new_frozen(st, st->frozen_dict);
    if (d == NULL)
        return NULL;
    for (int i = 0; i < n; i++)
        if (PyDict_SetItem(d, pairs[2 * i], pairs[2 * i + 1]) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    return d;
}

/* {**intent, "status": "consumed", "completed_at": at}, frozen (new), or
 * DECLINE for an intent that is not a FrozenDict. */
static PyObject *
consumed(module_state *st, kernel_spec *k, PyObject *intent, PyObject *at)
{
    if (intent == NULL || (PyObject *)Py_TYPE(intent) != st->frozen_dict)
        return Py_NewRef(DECLINE);
    PyObject *d = new_frozen(st, st->frozen_dict);
    if (d == NULL)
        return NULL;
    if (PyDict_Update(d, intent) < 0 || PyDict_SetItem(d, k->s[S_STATUS], k->s[S_CONSUMED]) < 0
        || PyDict_SetItem(d, k->s[S_COMPLETED_AT], at) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* Whether derive_put and dissoc_c derive m rather than decline: checked
 * before a transition derives anything, so a decline leaves every mapping's
 * lineage as it was (the Python code then derives from the same state). */
static int
derivable(module_state *st, PyObject *m)
{
    PyObject *t = (PyObject *)Py_TYPE(m);
    int layered = t == st->layered_dict, bad = 0;
    if (!layered && t != st->frozen_dict)
        return NO;
    (void)lineage_of(m, layered ? st->ld_lineage : st->fd_lineage, &bad);
    if (bad)
        return NO;
    PyObject *base, *over;
    Py_ssize_t length;
    return !layered || layers_of(st, m, &base, &over, &length) ? OK : NO;
}

/* Whether one more unit fits the budget (_records.reserve's check). */
static int
reservable(module_state *st, kernel_spec *k, PyObject *budget)
{
    if (budget == NULL || (PyObject *)Py_TYPE(budget) != k->budget_type)
        return NO;
    PyObject *quota = SLOT(budget, k->budget[B_QUOTA]), *used = SLOT(budget, k->budget[B_USED]);
    PyObject *reservations = SLOT(budget, k->budget[B_RESERVATIONS]);
    if (quota == NULL || used == NULL || reservations == NULL || !PyLong_CheckExact(quota)
        || !PyLong_CheckExact(used))
        return NO;
    int o1, o2;
    long long q = PyLong_AsLongLongAndOverflow(quota, &o1);
    long long u = PyLong_AsLongLongAndOverflow(used, &o2);
    if (o1 || o2 || u < 0 || u >= q)
        return NO;
    return derivable(st, reservations);
}

/* The budget with one unit reserved under key (_records.reserve), new; the
 * budget passed reservable and the key is unreserved. */
static PyObject *
reserved(module_state *st, kernel_spec *k, PyObject *budget, PyObject *key,
         Py_ssize_t layer_from, Py_ssize_t overlay_max)
{
    long long u = PyLong_AsLongLong(SLOT(budget, k->budget[B_USED]));
    if (u == -1 && PyErr_Occurred())
        return NULL;
    PyObject *reservations = Py_NewRef(SLOT(budget, k->budget[B_RESERVATIONS]));
    PyObject *held = put_stealing(st, reservations, key, PyLong_FromLong(1), layer_from,
                                  overlay_max);
    Py_DECREF(reservations);
    if (held == NULL || held == DECLINE)
        return held;
    PyObject *more = PyLong_FromLongLong(u + 1);
    PyObject *new = more == NULL ? NULL : slot_copy(budget);
    if (new == NULL) {
        Py_XDECREF(more);
        Py_DECREF(held);
        return NULL;
    }
    Py_XSETREF(SLOT(new, k->budget[B_USED]), more);
    Py_XSETREF(SLOT(new, k->budget[B_RESERVATIONS]), held);
    return new;
}

/* Whether key is free (in neither the intents nor the reservations) and one
 * more unit can be reserved under it. */
static int
reservable_key(module_state *st, kernel_spec *k, PyObject **record, PyObject *key)
{
    PyObject *budget = record[R_BUDGET];
    if (reservable(st, k, budget) != OK)
        return NO;
    int free = absent(st, record[R_INTENTS], key);
    if (free != OK)
        return free;
    PyObject *reservations = Py_NewRef(SLOT(budget, k->budget[B_RESERVATIONS]));
    free = absent(st, reservations, key);
    Py_DECREF(reservations);
    return free;
}

/* The transition's snapshots (strong references taken on entry): a
 * command's fields (NULL where its class has none) and the record's slots. */
#define FIELD(command, c, f) ((command)[f])
#define RECORD(obj, spec, r) ((obj)[r])
/* Leave with result r unless it is OK. */
#define TRY(expr)                  \
    do {                           \
        int r_ = (expr);           \
        if (r_ != OK) {            \
            result = r_;           \
            goto out;              \
        }                          \
    } while (0)
/* A new reference that must not be NULL (FAIL) or DECLINE (NO). */
#define HOLD(var, expr)                                 \
    do {                                                \
        var = (expr);                                   \
        if (var == NULL) {                              \
            result = FAIL;                              \
            goto out;                                   \
        }                                               \
        if (var == DECLINE) {                           \
            Py_CLEAR(var);                              \
            result = NO;                                \
            goto out;                                   \
        }                                               \
    } while (0)
/* A change, once nothing can decline any more (NULL: FAIL). */
#define CHANGE(slot, expr)                                   \
    do {                                                     \
        PyObject *v_ = (expr);                               \
        if (v_ == DECLINE) { /* never, after the checks */   \
            Py_DECREF(v_);                                   \
            v_ = NULL;                                       \
            PyErr_SetString(PyExc_SystemError, "transition: a checked derivation declined"); \
        }                                                    \
        if (change(ch, k->record[slot], v_) < 0) {           \
            result = FAIL;                                   \
            goto out;                                        \
        }                                                    \
    } while (0)

/* _handlers._with_context's checks: a frozen conversation state, frozen
 * lists to append, mappings to derive. */
static int
context_ok(module_state *st, kernel_spec *k, command_spec *c, PyObject **record, PyObject **command)
{
    PyObject *conversation = FIELD(command, c, F_CONVERSATION);
    PyObject *more[2] = {FIELD(command, c, F_MESSAGES), FIELD(command, c, F_USAGE)};
    int slot[2] = {R_TRANSCRIPT, R_USAGE};
    if (conversation == NULL || more[0] == NULL || more[1] == NULL)
        return NO;
    if (conversation != k->unset) {
        PyObject *t = (PyObject *)Py_TYPE(conversation);
        if ((t != st->frozen_dict && t != st->layered_dict)
            || derivable(st, RECORD(record, k, R_CONTEXT)) != OK)
            return NO;
    }
    for (int i = 0; i < 2; i++) {
        PyObject *items = RECORD(record, k, slot[i]);
        if (more[i] != k->unset
            && ((PyObject *)Py_TYPE(more[i]) != st->frozen_list || items == NULL
                || (PyObject *)Py_TYPE(items) != st->frozen_list))
            return NO;
    }
    return OK;
}

/* _handlers._with_context's changes, after context_ok. */
static int
with_context(module_state *st, kernel_spec *k, command_spec *c, PyObject **record,
             PyObject **command, changes *ch, Py_ssize_t layer_from, Py_ssize_t overlay_max)
{
    int result = OK;
    PyObject *conversation = FIELD(command, c, F_CONVERSATION);
    PyObject *more[2] = {FIELD(command, c, F_MESSAGES), FIELD(command, c, F_USAGE)};
    int slot[2] = {R_TRANSCRIPT, R_USAGE};
    if (conversation != k->unset)
        CHANGE(R_CONTEXT, derive_put(st, RECORD(record, k, R_CONTEXT), k->s[S_CONVERSATION],
                                     conversation, layer_from, overlay_max));
    for (int i = 0; i < 2; i++)
        if (more[i] != k->unset)
            CHANGE(slot[i], grown_impl(st, RECORD(record, k, slot[i]), more[i]));
out:
    return result;
}

static int
provider_started(module_state *st, kernel_spec *k, command_spec *c, PyObject **record,
                 PyObject **command, changes *ch, long long incarnation,
                 Py_ssize_t layer_from, Py_ssize_t overlay_max)
{
    int result = OK;
    PyObject *counters = NULL, *attempt_id = NULL, *step_id = NULL, *key = NULL;
    PyObject *intent = NULL, *provider = NULL;
    PyObject *old = RECORD(record, k, R_COUNTERS), *tools = RECORD(record, k, R_ACTIVE_TOOLS);
    PyObject *turn_id = FIELD(command, c, F_TURN_ID);
    if (RECORD(record, k, R_ACTIVE_PROVIDER) != Py_None || RECORD(record, k, R_ACTIVE_WAIT) != Py_None
        || tools == NULL || (PyObject *)Py_TYPE(tools) != st->frozen_dict || PyDict_GET_SIZE(tools)
        || old == NULL || (PyObject *)Py_TYPE(old) != st->frozen_dict || turn_id == NULL
        || derivable(st, RECORD(record, k, R_INTENTS)) != OK)
        return NO;
    long long attempts = counter(old, k->s[S_ATTEMPT]), steps = counter(old, k->s[S_STEP]);
    if (attempts < 0 || steps < 0)
        return NO;
    HOLD(counters, new_frozen(st, st->frozen_dict));
    if (PyDict_Update(counters, old) < 0) {
        result = FAIL;
        goto out;
    }
    HOLD(attempt_id, next_id(counters, k->s[S_ATTEMPT], attempts, incarnation));
    HOLD(step_id, next_id(counters, k->s[S_STEP], steps, incarnation));
    HOLD(key, PyUnicode_FromFormat("provider:%U", attempt_id));
    TRY(reservable_key(st, k, record, key));
    PyObject *at = FIELD(command, c, F_AT);
    PyObject *pairs[16] = {
        k->s[S_KIND], k->s[S_PROVIDER], k->s[S_STATUS], k->s[S_STARTED],
        k->s[S_EFFECT_CLASS], k->s[S_READ_ONLY], k->s[S_DISPATCH_STATE], k->s[S_UNKNOWN],
        k->s[S_ATTEMPT_ID], attempt_id, k->s[S_STEP_ID], step_id, k->s[S_STARTED_AT], at,
        k->s[S_TURN_ID], turn_id,
    };
    int turn = turn_id != k->unset;
    HOLD(intent, frozen_of(st, turn ? 8 : 7, pairs));
    PyObject *ids[6] = {k->s[S_ATTEMPT_ID], attempt_id, k->s[S_STEP_ID], step_id,
                        k->s[S_TURN_ID], turn_id};
    HOLD(provider, frozen_of(st, turn ? 3 : 2, ids));
    /* nothing declines from here on */
    CHANGE(R_BUDGET, reserved(st, k, RECORD(record, k, R_BUDGET), key, layer_from, overlay_max));
    CHANGE(R_INTENTS, put_stealing(st, RECORD(record, k, R_INTENTS), key, Py_NewRef(intent),
                                   layer_from, overlay_max));
    CHANGE(R_COUNTERS, Py_NewRef(counters));
    CHANGE(R_STEP_ID, Py_NewRef(step_id));
    CHANGE(R_ACTIVE_PROVIDER, Py_NewRef(provider));
out:
    Py_XDECREF(counters);
    Py_XDECREF(attempt_id);
    Py_XDECREF(step_id);
    Py_XDECREF(key);
    Py_XDECREF(intent);
    Py_XDECREF(provider);
    return result;
}

/* The provider result {"attempt_id", "result"} as its converter freezes it. */
static PyObject *
result_of(module_state *st, kernel_spec *k, PyObject *attempt_id, PyObject *res)
{
    PyObject *plain = PyDict_New();
    if (plain == NULL || PyDict_SetItem(plain, k->s[S_ATTEMPT_ID], attempt_id) < 0
        || PyDict_SetItem(plain, k->s[S_RESULT], res) < 0) {
        Py_XDECREF(plain);
        return NULL;
    }
    PyObject *frozen = freeze_value(st, plain, 0, k->record_depth);
    Py_DECREF(plain);
    return frozen;
}

static int
provider_completed(module_state *st, kernel_spec *k, command_spec *c, PyObject **record,
                   PyObject **command, changes *ch, long long incarnation,
                   Py_ssize_t layer_from, Py_ssize_t overlay_max)
{
    int result = OK, how;
    PyObject *key = NULL, *intent = NULL, *provider_result = NULL;
    PyObject *provider = RECORD(record, k, R_ACTIVE_PROVIDER);
    PyObject *given = FIELD(command, c, F_ATTEMPT_ID), *final = FIELD(command, c, F_FINAL);
    PyObject *res = FIELD(command, c, F_RESULT);
    if (provider == NULL || (PyObject *)Py_TYPE(provider) != st->frozen_dict || given == NULL
        || final == NULL || final == Py_True || res == NULL
        || derivable(st, RECORD(record, k, R_INTENTS)) != OK
        || context_ok(st, k, c, record, command) != OK)
        return NO;
    PyObject *attempt_id = PyDict_GetItemWithError(provider, k->s[S_ATTEMPT_ID]);
    if (attempt_id == NULL)
        return PyErr_Occurred() ? FAIL : NO;
    if (!PyUnicode_CheckExact(attempt_id))
        return NO;
    if (given != k->unset && given != Py_None
        && (!PyUnicode_CheckExact(given) || PyUnicode_Compare(given, attempt_id) != 0))
        return PyErr_Occurred() ? FAIL : NO;  /* (exact strs: no Python code compares) */
    HOLD(key, PyUnicode_FromFormat("provider:%U", attempt_id));
    PyObject *old = lookup(st, RECORD(record, k, R_INTENTS), key, &how);
    TRY(how);
    intent = consumed(st, k, old, FIELD(command, c, F_AT));
    Py_XDECREF(old);
    HOLD(intent, intent);
    HOLD(provider_result, result_of(st, k, attempt_id, res == k->unset ? Py_None : res));
    /* nothing declines from here on */
    CHANGE(R_INTENTS, put_stealing(st, RECORD(record, k, R_INTENTS), key, Py_NewRef(intent),
                                   layer_from, overlay_max));
    CHANGE(R_PROVIDER_RESULT, Py_NewRef(provider_result));
    CHANGE(R_ACTIVE_PROVIDER, Py_NewRef(Py_None));
    TRY(with_context(st, k, c, record, command, ch, layer_from, overlay_max));
out:
    Py_XDECREF(key);
    Py_XDECREF(intent);
    Py_XDECREF(provider_result);
    return result;
}

/* _handlers._invoked_in_step's walk down the step's invocations: OK when
 * call_id is not among them, NO when it is or the walk needs every intent. */
static int
not_invoked(module_state *st, kernel_spec *k, PyObject **record, PyObject *step_id,
            PyObject *call_id, long long incarnation)
{
    long long n = counter(RECORD(record, k, R_COUNTERS), k->s[S_INVOCATION]);
    for (; n > 0; n--) {
        int how;
        PyObject *key = PyUnicode_FromFormat("tool:invocation-%lld-%lld", incarnation, n);
        if (key == NULL)
            return FAIL;
        PyObject *intent = lookup(st, RECORD(record, k, R_INTENTS), key, &how);
        Py_DECREF(key);
        if (how != OK)
            return how;
        if (intent == NULL || (PyObject *)Py_TYPE(intent) != st->frozen_dict) {
            Py_XDECREF(intent);
            return NO;  /* the Python walk looks at every intent */
        }
        /* exact strs (or missing) only: no Python code compares them */
        PyObject *step = PyDict_GetItemWithError(intent, k->s[S_STEP_ID]);
        PyObject *call = step == NULL ? NULL : PyDict_GetItemWithError(intent, k->s[S_TOOL_CALL_ID]);
        int verdict;
        if (PyErr_Occurred())
            verdict = FAIL;
        else if (step == NULL || !PyUnicode_CheckExact(step)
                 || (call != NULL && !PyUnicode_CheckExact(call)))
            verdict = NO;
        else if (PyUnicode_Compare(step, step_id) != 0)
            verdict = OK;  /* the step's tools are all above this one */
        else if (call != NULL && PyUnicode_Compare(call, call_id) == 0)
            verdict = NO;  /* invoked already: the Python code refuses it */
        else
            verdict = -2;  /* go on down */
        Py_DECREF(intent);
        if (verdict != -2)
            return PyErr_Occurred() ? FAIL : verdict;
    }
    return NO;
}

static int
tool_invoked(module_state *st, kernel_spec *k, command_spec *c, PyObject **record,
             PyObject **command, changes *ch, long long incarnation,
             Py_ssize_t layer_from, Py_ssize_t overlay_max)
{
    static const int identity_fields[6] = {F_TOOL_NAME, F_TOOL_REVISION, F_TOOL_CALL_ID,
                                           F_TURN_ID, F_ARGUMENTS_DIGEST,
                                           F_EFFECTIVE_AUTHORITY};
    static const int identity_names[6] = {S_TOOL_NAME, S_TOOL_REVISION, S_TOOL_CALL_ID,
                                          S_TURN_ID, S_ARGUMENTS_DIGEST,
                                          S_EFFECTIVE_AUTHORITY};
    int result = OK;
    PyObject *counters = NULL, *invocation_id = NULL, *key = NULL, *identity = NULL;
    PyObject *intent = NULL;
    PyObject *step_id = RECORD(record, k, R_STEP_ID), *old = RECORD(record, k, R_COUNTERS);
    PyObject *given = FIELD(command, c, F_STEP_ID), *call_id = FIELD(command, c, F_TOOL_CALL_ID);
    PyObject *effect = FIELD(command, c, F_EFFECT_CLASS);
    PyObject *dispatch = FIELD(command, c, F_DISPATCH_STATE);
    if (RECORD(record, k, R_ACTIVE_PROVIDER) != Py_None || step_id == NULL
        || !PyUnicode_CheckExact(step_id) || old == NULL
        || (PyObject *)Py_TYPE(old) != st->frozen_dict || given == NULL || call_id == NULL
        || effect == NULL || dispatch == NULL
        || derivable(st, RECORD(record, k, R_ACTIVE_TOOLS)) != OK
        || derivable(st, RECORD(record, k, R_INTENTS)) != OK)
        return NO;
    if (given != k->unset) {
        if (!PyUnicode_CheckExact(given) || PyUnicode_Compare(given, step_id) != 0)
            return PyErr_Occurred() ? FAIL : NO;
        step_id = given;  /* equal: the command's, as the Python handler keeps */
    }
    if (call_id != k->unset && call_id != Py_None && !PyUnicode_CheckExact(call_id))
        return NO;  /* compared below as exact strs only: no Python code runs */
    if (call_id != k->unset && call_id != Py_None)
        TRY(not_invoked(st, k, record, step_id, call_id, incarnation));
    long long invocations = counter(old, k->s[S_INVOCATION]);
    if (invocations < 0)
        return NO;
    PyObject *pairs[2 * 8] = {k->s[S_INVOCATION_ID], NULL, k->s[S_STEP_ID], step_id};
    int n = 2;
    for (int i = 0; i < 6; i++) {
        PyObject *v = FIELD(command, c, identity_fields[i]);
        if (v == NULL)
            return NO;
        if (v != k->unset) {
            pairs[2 * n] = k->s[identity_names[i]];
            pairs[2 * n + 1] = v;
            n++;
        }
    }
    HOLD(counters, new_frozen(st, st->frozen_dict));
    if (PyDict_Update(counters, old) < 0) {
        result = FAIL;
        goto out;
    }
    HOLD(invocation_id, next_id(counters, k->s[S_INVOCATION], invocations, incarnation));
    HOLD(key, PyUnicode_FromFormat("tool:%U", invocation_id));
    TRY(reservable_key(st, k, record, key));
    pairs[1] = invocation_id;
    HOLD(identity, frozen_of(st, n, pairs));
    PyObject *head[10] = {
        k->s[S_KIND], k->s[S_TOOL], k->s[S_STATUS], k->s[S_STARTED],
        k->s[S_EFFECT_CLASS], effect == k->unset ? k->s[S_MUTATION] : effect,
        k->s[S_DISPATCH_STATE], dispatch == k->unset ? k->s[S_UNKNOWN] : dispatch,
        k->s[S_STARTED_AT], FIELD(command, c, F_AT),
    };
    HOLD(intent, frozen_of(st, 5, head));
    if (PyDict_Update(intent, identity) < 0) {
        result = FAIL;
        goto out;
    }
    /* nothing declines from here on */
    CHANGE(R_BUDGET, reserved(st, k, RECORD(record, k, R_BUDGET), key, layer_from, overlay_max));
    CHANGE(R_ACTIVE_TOOLS, put_stealing(st, RECORD(record, k, R_ACTIVE_TOOLS), invocation_id,
                                        Py_NewRef(identity), layer_from, overlay_max));
    CHANGE(R_INTENTS, put_stealing(st, RECORD(record, k, R_INTENTS), key, Py_NewRef(intent),
                                   layer_from, overlay_max));
    CHANGE(R_COUNTERS, Py_NewRef(counters));
out:
    Py_XDECREF(counters);
    Py_XDECREF(invocation_id);
    Py_XDECREF(key);
    Py_XDECREF(identity);
    Py_XDECREF(intent);
    return result;
}

/* _derived.dissoc: mapping without key, with its lineage (new or DECLINE). */
static PyObject *
dissoc_c(module_state *st, PyObject *mapping, PyObject *key)
{
    PyObject *t = (PyObject *)Py_TYPE(mapping);
    int layered = t == st->layered_dict;
    if (!layered && t != st->frozen_dict)
        return Py_NewRef(DECLINE);
    Py_ssize_t lineage_at = layered ? st->ld_lineage : st->fd_lineage;
    int bad = 0;
    PyObject *lineage = lineage_of(mapping, lineage_at, &bad);
    if (bad)
        return Py_NewRef(DECLINE);
    PyObject *base = NULL, *over = NULL;
    Py_ssize_t old_len = layered ? 0 : PyDict_GET_SIZE(mapping);
    if (layered && !layers_of(st, mapping, &base, &over, &old_len))
        return Py_NewRef(DECLINE);
    PyObject *new = new_frozen(st, st->frozen_dict);
    if (new == NULL)
        return NULL;
    if (layered) {
        if (PyDict_Update(new, base) < 0 || PyDict_Update(new, over) < 0) {
            Py_DECREF(new);
            return NULL;
        }
    }
    else {
        if (PyDict_Update(new, mapping) < 0) {
            Py_DECREF(new);
            return NULL;
        }
    }
    if (PyDict_DelItem(new, key) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
            Py_DECREF(new);
            return NULL;
        }
        PyErr_Clear();
    }
    Py_XINCREF(lineage);
    new = with_lineage(st, mapping, lineage_at, lineage, old_len, key, new);
    Py_XDECREF(lineage);
    return new;
}

static int
tool_completed(module_state *st, kernel_spec *k, command_spec *c, PyObject **record,
               PyObject **command, changes *ch, long long incarnation,
               Py_ssize_t layer_from, Py_ssize_t overlay_max)
{
    int result = OK, how;
    PyObject *key = NULL, *intent = NULL, *value = NULL;
    PyObject *id = FIELD(command, c, F_INVOCATION_ID), *res = FIELD(command, c, F_RESULT);
    PyObject *tools = RECORD(record, k, R_ACTIVE_TOOLS);
    if (id == NULL || res == NULL || !PyUnicode_CheckExact(id) || derivable(st, tools) != OK
        || derivable(st, RECORD(record, k, R_INTENTS)) != OK
        || derivable(st, RECORD(record, k, R_TOOL_RESULTS)) != OK
        || context_ok(st, k, c, record, command) != OK)
        return NO;
    PyObject *active = lookup(st, tools, id, &how);
    if (how != OK || active == NULL)
        return how == FAIL ? FAIL : NO;
    Py_DECREF(active);
    HOLD(key, PyUnicode_FromFormat("tool:%U", id));
    PyObject *old = lookup(st, RECORD(record, k, R_INTENTS), key, &how);
    TRY(how);
    intent = consumed(st, k, old, FIELD(command, c, F_AT));
    Py_XDECREF(old);
    HOLD(intent, intent);
    HOLD(value, checked_value(st, res == k->unset ? Py_None : res, k->max_depth));
    /* nothing declines from here on */
    CHANGE(R_ACTIVE_TOOLS, dissoc_c(st, tools, id));
    CHANGE(R_INTENTS, put_stealing(st, RECORD(record, k, R_INTENTS), key, Py_NewRef(intent),
                                   layer_from, overlay_max));
    CHANGE(R_TOOL_RESULTS, put_stealing(st, RECORD(record, k, R_TOOL_RESULTS), id,
                                        Py_NewRef(value), layer_from, overlay_max));
    TRY(with_context(st, k, c, record, command, ch, layer_from, overlay_max));
out:
    Py_XDECREF(key);
    Py_XDECREF(intent);
    Py_XDECREF(value);
    return result;
}

typedef int (*handler_fn)(module_state *, kernel_spec *, command_spec *, PyObject **, PyObject **,
                          changes *, long long, Py_ssize_t, Py_ssize_t);
static const handler_fn HANDLERS[N_KINDS] = {provider_started, provider_completed, tool_invoked,
                                             tool_completed};

/* The checks _transition._apply makes before its handler: a running record,
 * the command's own run and incarnation, the run deadline; and the new
 * revision.  OK with *revision_out (new) and *incarnation_out set. */
static int
preconditions(kernel_spec *k, command_spec *c, PyObject **record, PyObject **command,
              PyObject *revision, PyObject **revision_out, long long *incarnation_out)
{
    PyObject *state = RECORD(record, k, R_STATE), *at = FIELD(command, c, F_AT);
    PyObject *run_id = FIELD(command, c, F_RUN_ID), *inc = FIELD(command, c, F_INCARNATION);
    PyObject *own_inc = RECORD(record, k, R_INCARNATION), *deadline = RECORD(record, k, R_DEADLINE);
    PyObject *own_rev = RECORD(record, k, R_REVISION), *source = FIELD(command, c, F_SOURCE);
    if (state == NULL || at == NULL || run_id == NULL || inc == NULL || own_inc == NULL
        || deadline == NULL || own_rev == NULL || source != Py_None
        || !PyUnicode_CheckExact(state) || !PyLong_CheckExact(own_inc)
        || !PyLong_CheckExact(own_rev) || !(PyFloat_CheckExact(at) || PyLong_CheckExact(at)))
        return NO;
    if (PyLong_CheckExact(at)) {  /* a time the event's double holds exactly */
        int big;
        long long t = PyLong_AsLongLongAndOverflow(at, &big);
        if (big || t > (1LL << 53) || t < -(1LL << 53))
            return NO;
    }
    int running = PyUnicode_Compare(state, k->s[S_RUNNING]);
    if (running != 0)
        return running == -1 && PyErr_Occurred() ? FAIL : NO;
    if (run_id != k->unset) {
        PyObject *own = RECORD(record, k, R_RUN_ID);
        if (!PyUnicode_CheckExact(run_id) || own == NULL || PyUnicode_Compare(run_id, own) != 0)
            return PyErr_Occurred() ? FAIL : NO;
    }
    int overflow;
    long long incarnation = PyLong_AsLongLongAndOverflow(own_inc, &overflow);
    if (overflow || incarnation <= 0)
        return NO;
    if (inc != k->unset) {
        if (!PyLong_CheckExact(inc))
            return NO;
        long long theirs = PyLong_AsLongLongAndOverflow(inc, &overflow);
        if (overflow || theirs != incarnation)
            return NO;
    }
    if (deadline != Py_None) {
        if (!(PyFloat_CheckExact(deadline) || PyLong_CheckExact(deadline)))
            return NO;
        int late = PyObject_RichCompareBool(at, deadline, Py_GT);
        if (late != 0)
            return late < 0 ? FAIL : NO;
    }
    long long rev = PyLong_AsLongLongAndOverflow(own_rev, &overflow);
    if (overflow || rev < 0 || rev >= LLONG_MAX - 1)
        return NO;
    if (revision == Py_None) {
        *revision_out = PyLong_FromLongLong(rev + 1);
        if (*revision_out == NULL)
            return FAIL;
    }
    else {
        if (!PyLong_CheckExact(revision))
            return NO;
        long long given = PyLong_AsLongLongAndOverflow(revision, &overflow);
        if (overflow || given < rev || given > rev + 1)
            return NO;
        *revision_out = Py_NewRef(revision);
    }
    *incarnation_out = incarnation;
    return OK;
}

/* The kernel event of a new record: "run.<kind>" with {"state", "input"}. */
static PyObject *
kernel_event_c(module_state *st, kernel_spec *k, command_spec *c, PyObject *new,
               PyObject **command, PyObject *given)
{
    PyObject *at = FIELD(command, c, F_AT);
    PyObject *when = PyFloat_CheckExact(at) ? Py_NewRef(at)
                                            : PyFloat_FromDouble(PyLong_AsDouble(at));
    if (when == NULL)
        return NULL;
    PyObject *pairs[4] = {k->s[S_STATE], SLOT(new, k->record[R_STATE]), k->s[S_INPUT], given};
    PyObject *payload = frozen_of(st, 2, pairs);
    PyObject *event = payload == NULL ? NULL : slot_copy(k->event_proto);
    if (event == NULL) {
        Py_DECREF(when);
        Py_XDECREF(payload);
        return NULL;
    }
    Py_XSETREF(SLOT(event, k->event[E_TYPE]), Py_NewRef(c->event_type));
    Py_XSETREF(SLOT(event, k->event[E_AT]), when);
    Py_XSETREF(SLOT(event, k->event[E_PAYLOAD]), payload);
    Py_XSETREF(SLOT(event, k->event[E_SEQUENCE]), Py_NewRef(Py_None));
    PyObject *events = PyList_New(1);
    if (events == NULL) {
        Py_DECREF(event);
        return NULL;
    }
    PyList_SET_ITEM(events, 0, event);
    return events;
}

/* Strong references to the record's slots and the command's fields: what
 * the handlers read stays alive whatever runs meanwhile.  NO when one the
 * kernel reads is unset. */
static int
snapshot(kernel_spec *k, command_spec *c, PyObject *record, PyObject *command,
         PyObject **rv, PyObject **fv)
{
    int result = OK;
    for (int i = 0; i < N_RECORD; i++) {
        rv[i] = Py_XNewRef(SLOT(record, k->record[i]));
        if (rv[i] == NULL)
            result = NO;
    }
    for (int f = 0; f < N_FIELDS; f++) {
        fv[f] = c->field[f] < 0 ? NULL : Py_XNewRef(SLOT(command, c->field[f]));
        if (c->field[f] >= 0 && fv[f] == NULL)
            result = NO;
    }
    return result;
}

static PyObject *
transition(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *st = called(module, nargs, 5,
                              "transition(record, command, revision, layer_from, overlay_max)");
    if (st == NULL)
        return NULL;
    kernel_spec *k = st->kernel;
    PyObject *record = args[0], *command = args[1];
    if (k == NULL || (PyObject *)Py_TYPE(record) != k->record_type)
        return Py_NewRef(DECLINE);
    command_spec *c = NULL;
    for (int i = 0; i < N_KINDS; i++)
        if ((PyObject *)Py_TYPE(command) == k->kinds[i].type)
            c = &k->kinds[i];
    if (c == NULL)
        return Py_NewRef(DECLINE);
    Py_ssize_t layer_from = PyLong_AsSsize_t(args[3]);
    Py_ssize_t overlay_max = PyLong_AsSsize_t(args[4]);
    if ((layer_from == -1 || overlay_max == -1) && PyErr_Occurred())
        return NULL;
    PyObject *rv[N_RECORD], *fv[N_FIELDS];
    PyObject *revision = NULL, *given = NULL, *new = NULL, *events = NULL, *out = NULL;
    long long incarnation = 0;
    changes ch = {.n = 0};
    int result = snapshot(k, c, record, command, rv, fv);
    if (result != OK)
        goto out;
    /* the event's input first, as the Python code computes it */
    given = event_input_of(st, k, c, command);
    if (given == NULL || given == DECLINE) {
        result = given == NULL ? FAIL : NO;
        Py_CLEAR(given);
        goto out;
    }
    result = preconditions(k, c, rv, fv, args[2], &revision, &incarnation);
    if (result != OK)
        goto out;
    result = HANDLERS[c - k->kinds](st, k, c, rv, fv, &ch, incarnation, layer_from,
                                    overlay_max);
    if (result != OK)
        goto out;
    new = slot_copy(record);
    if (new == NULL) {
        result = FAIL;
        goto out;
    }
    for (int i = 0; i < ch.n; i++) {
        Py_XSETREF(SLOT(new, ch.at[i]), ch.value[i]);
        ch.value[i] = NULL;
    }
    Py_XSETREF(SLOT(new, k->record[R_REVISION]), revision);
    revision = NULL;
    events = kernel_event_c(st, k, c, new, fv, given);
    if (events == NULL) {
        result = FAIL;
        goto out;
    }
    out = PyTuple_Pack(2, new, events);
    if (out == NULL)
        result = FAIL;
out:
    if (result == FAIL && ch.n == 0
        && (PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_KeyError)
            || PyErr_ExceptionMatches(PyExc_AttributeError))) {
        /* a record's own data failing as it is read (a hostile key's __eq__,
         * say) before anything was derived: the Python code classes it */
        PyErr_Clear();
        result = NO;
    }
    changes_clear(&ch);
    for (int i = 0; i < N_RECORD; i++)
        Py_XDECREF(rv[i]);
    for (int f = 0; f < N_FIELDS; f++)
        Py_XDECREF(fv[f]);
    Py_XDECREF(revision);
    Py_XDECREF(given);
    Py_XDECREF(new);
    Py_XDECREF(events);
    if (result == NO) {
        if (PyErr_Occurred())  /* never: a decline sets no exception */
            PyErr_Clear();
        return Py_NewRef(DECLINE);
    }
    return result == OK ? out : NULL;
}

static int
kernel_traverse(kernel_spec *k, visitproc visit, void *arg)
{
    if (k == NULL)
        return 0;
    Py_VISIT(k->record_type);
    Py_VISIT(k->budget_type);
    Py_VISIT(k->event_proto);
    Py_VISIT(k->unset);
    Py_VISIT(k->key_summaries);
    Py_VISIT(k->item_summaries);
    for (int i = 0; i < N_KINDS; i++) {
        Py_VISIT(k->kinds[i].type);
        Py_VISIT(k->kinds[i].event_type);
    }
    return 0;
}

static void
kernel_free(kernel_spec *k)
{
    if (k == NULL)
        return;
    Py_CLEAR(k->record_type);
    Py_CLEAR(k->budget_type);
    Py_CLEAR(k->event_proto);
    Py_CLEAR(k->unset);
    Py_CLEAR(k->key_summaries);
    Py_CLEAR(k->item_summaries);
    for (int i = 0; i < N_STRINGS; i++)
        Py_CLEAR(k->s[i]);
    for (int i = 0; i < N_KINDS; i++) {
        Py_CLEAR(k->kinds[i].type);
        Py_CLEAR(k->kinds[i].event_type);
        for (Py_ssize_t j = 0; j < k->kinds[i].n_input; j++)
            Py_CLEAR(k->kinds[i].input_name[j]);
    }
    PyMem_Free(k);
}

/* The offsets of names[0..n) in t into out; -1 (TypeError) when one lacks. */
static int
offsets_of(PyObject *t, const char *const *names, int n, Py_ssize_t *out)
{
    for (int i = 0; i < n; i++) {
        out[i] = slot_offset_in(t, names[i]);
        if (out[i] < 0) {
            PyErr_Format(PyExc_TypeError, "configure_transition: %R has no slot %s", t, names[i]);
            return -1;
        }
    }
    return 0;
}

/* One command kind: (class, event type, ((field, digested), ...)). */
static int
command_of(kernel_spec *k, command_spec *c, PyObject *spec)
{
    PyObject *type, *event_type, *inputs;
    if (!PyTuple_Check(spec)) {
        PyErr_SetString(PyExc_TypeError, "configure_transition: a command is a tuple");
        return -1;
    }
    if (!PyArg_ParseTuple(spec, "OUO!", &type, &event_type, &PyTuple_Type, &inputs))
        return -1;
    /* the handler is chosen by position: the event type says whose it is */
    int same = PyUnicode_CompareWithASCIIString(event_type, EVENT_TYPES[c - k->kinds]);
    if (same != 0) {
        PyErr_Format(PyExc_TypeError, "configure_transition: command %zd must be %s",
                     (Py_ssize_t)(c - k->kinds), EVENT_TYPES[c - k->kinds]);
        return -1;
    }
    if (!PyType_Check(type) || !slots_only((PyTypeObject *)type)
        || PyTuple_GET_SIZE(inputs) > MAX_INPUTS) {
        PyErr_SetString(PyExc_TypeError, "configure_transition: a slotted command class");
        return -1;
    }
    c->type = Py_NewRef(type);
    c->event_type = Py_NewRef(event_type);
    for (int f = 0; f < N_FIELDS; f++)
        c->field[f] = slot_offset_in(type, FIELD_NAMES[f]);
    if (c->field[F_AT] < 0 || c->field[F_RUN_ID] < 0 || c->field[F_INCARNATION] < 0
        || c->field[F_SOURCE] < 0) {
        PyErr_SetString(PyExc_TypeError, "configure_transition: a command lacks its base slots");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(inputs); i++) {
        PyObject *name;
        int digested;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(inputs, i), "Up", &name, &digested))
            return -1;
        const char *text = PyUnicode_AsUTF8(name);
        if (text == NULL)
            return -1;
        Py_ssize_t at = slot_offset_in(type, text);
        if (at < 0) {
            PyErr_Format(PyExc_TypeError, "configure_transition: no slot %U", name);
            return -1;
        }
        c->input_name[i] = Py_NewRef(name);
        c->input_at[i] = at;
        c->digested[i] = digested;
        c->n_input = i + 1;
    }
    return 0;
}

static PyObject *
configure_transition(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *st = called(module, nargs, 9,
                              "configure_transition(record_type, budget_type, event, unset, "
                              "key_summaries, item_summaries, max_depth, record_depth, "
                              "commands)");
    if (st == NULL)
        return NULL;
    kernel_spec *k = PyMem_Calloc(1, sizeof(kernel_spec));
    if (k == NULL)
        return PyErr_NoMemory();
    PyObject *commands = args[8];
    if (!PyType_Check(args[0]) || !PyType_Check(args[1])
        || !slots_only((PyTypeObject *)args[0]) || !slots_only((PyTypeObject *)args[1])
        || !slots_only(Py_TYPE(args[2])) || !PyDict_CheckExact(args[4])
        || !PyTuple_CheckExact(args[5]) || !PyTuple_CheckExact(commands)
        || PyTuple_GET_SIZE(commands) != N_KINDS) {
        PyErr_SetString(PyExc_TypeError, "configure_transition: unexpected arguments");
        goto failed;
    }
    k->record_type = Py_NewRef(args[0]);
    k->budget_type = Py_NewRef(args[1]);
    k->event_proto = Py_NewRef(args[2]);
    k->unset = Py_NewRef(args[3]);
    k->key_summaries = Py_NewRef(args[4]);
    k->item_summaries = Py_NewRef(args[5]);
    long depths[2] = {PyLong_AsLong(args[6]), PyLong_AsLong(args[7])};
    if (PyErr_Occurred())
        goto failed;
    if (depths[0] < 1 || depths[0] > 100000 || depths[1] < 1 || depths[1] > 100000) {
        PyErr_SetString(PyExc_ValueError, "configure_transition: depth limits from 1 to 100000");
        goto failed;
    }
    k->max_depth = (int)depths[0];
    k->record_depth = (int)depths[1];
    if (offsets_of(args[0], RECORD_NAMES, N_RECORD, k->record) < 0
        || offsets_of(args[1], BUDGET_NAMES, N_BUDGET, k->budget) < 0
        || offsets_of((PyObject *)Py_TYPE(args[2]), EVENT_NAMES, N_EVENT, k->event) < 0)
        goto failed;
    for (int i = 0; i < N_STRINGS; i++)
        if ((k->s[i] = PyUnicode_InternFromString(STRINGS[i])) == NULL)
            goto failed;
    for (int i = 0; i < N_KINDS; i++)
        if (command_of(k, &k->kinds[i], PyTuple_GET_ITEM(commands, i)) < 0)
            goto failed;
    kernel_free(st->kernel);
    st->kernel = k;
    Py_RETURN_NONE;
failed:
    kernel_free(k);
    return NULL;
}

/* ---- command: a typed command built without attrs' __init__ --------------
 *
 * command(cls, at, fields) -> cls(at=at, **fields) | NotImplemented
 *
 * The same instance attrs' __init__ makes for the fields a runtime passes:
 * a copy of the class's blank instance (every field UNSET, no source) with
 * `at` and the given fields set.  It declines (the class's own __init__
 * then decides and words any error) for a time its validator would refuse,
 * a field the class does not have, and a value a field's converter would
 * not keep as it is (anything but its default, a frozen container, None or
 * a bool). */

/* A class table: configure_commands' (the command classes) and
 * register_record's.  Each entry: the class, its blank instance (the
 * defaults), its init fields' keywords and slots. */

#define MAX_RECORDS 32
#define MAX_FIELDS 24

typedef struct {
    PyObject *type, *blank;
    Py_ssize_t n, positional;           /* init fields; the first `positional` by position */
    PyObject *alias[MAX_FIELDS];        /* each field's keyword */
    Py_ssize_t slot[MAX_FIELDS];
    Py_ssize_t at;                      /* a command's `at` slot */
    int converted[MAX_FIELDS];          /* a command's field frozen by a converter */
} record_spec;

struct records {
    Py_ssize_t n;
    record_spec of[MAX_RECORDS];
};

static int
records_traverse(records *all, visitproc visit, void *arg)
{
    for (Py_ssize_t i = 0; all != NULL && i < all->n; i++) {
        Py_VISIT(all->of[i].type);
        Py_VISIT(all->of[i].blank);
    }
    return 0;
}

static void
records_free(records *all)
{
    for (Py_ssize_t i = 0; all != NULL && i < all->n; i++) {
        Py_CLEAR(all->of[i].type);
        Py_CLEAR(all->of[i].blank);
        for (Py_ssize_t j = 0; j < all->of[i].n; j++)
            Py_CLEAR(all->of[i].alias[j]);
    }
    PyMem_Free(all);
}

/* Whether `at` passes the commands' time validator (_fields.is_time). */
static int
is_time(PyObject *at)
{
    if (PyFloat_CheckExact(at))
        return isfinite(PyFloat_AS_DOUBLE(at));
    if (!PyLong_CheckExact(at))
        return 0;
    int big;
    long long t = PyLong_AsLongLongAndOverflow(at, &big);
    return !big && t <= (1LL << 53) && t >= -(1LL << 53);
}

static PyObject *
command(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *st = called(module, nargs, 3, "command(cls, at, fields)");
    if (st == NULL)
        return NULL;
    records *all = st->commands;
    PyObject *fields = args[2], *ft = (PyObject *)Py_TYPE(fields);
    record_spec *b = NULL;
    for (Py_ssize_t i = 0; all != NULL && i < all->n; i++)
        if (all->of[i].type == args[0])
            b = &all->of[i];
    if (b == NULL || !is_time(args[1]) || (ft != (PyObject *)&PyDict_Type && ft != st->frozen_dict))
        return Py_NewRef(DECLINE);
    PyObject *new = slot_copy(b->blank);
    if (new == NULL)
        return NULL;
    Py_ssize_t found = 0;
    for (Py_ssize_t i = 0; i < b->n && found < PyDict_GET_SIZE(fields); i++) {
        PyObject *v = PyDict_GetItemWithError(fields, b->alias[i]);
        if (v == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(new);
                return NULL;
            }
            continue;
        }
        PyObject *t = (PyObject *)Py_TYPE(v);
        if (b->converted[i] && v != SLOT(b->blank, b->slot[i])  /* its default */
            && !(t == st->frozen_list || t == st->frozen_dict || t == st->layered_dict
                 || v == Py_None || t == (PyObject *)&PyBool_Type)) {
            Py_DECREF(new);
            return Py_NewRef(DECLINE);
        }
        Py_XSETREF(SLOT(new, b->slot[i]), Py_NewRef(v));
        found++;
    }
    if (found != PyDict_GET_SIZE(fields)) {  /* a key the class does not have */
        Py_DECREF(new);
        return Py_NewRef(DECLINE);
    }
    Py_XSETREF(SLOT(new, b->at), Py_NewRef(args[1]));
    return new;
}

/* configure_commands(((cls, blank, ((field, converted), ...)), ...)): each
 * class, its blank instance (`at` set, every other field its default) and
 * its other init fields. */
static PyObject *
configure_commands(PyObject *module, PyObject *specs)
{
    module_state *st = PyModule_GetState(module);
    if (!PyTuple_Check(specs) || PyTuple_GET_SIZE(specs) > MAX_RECORDS) {
        PyErr_SetString(PyExc_TypeError, "configure_commands: a tuple of at most 32 classes");
        return NULL;
    }
    records *all = PyMem_Calloc(1, sizeof(records));
    if (all == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(specs); i++) {
        record_spec *b = &all->of[i];
        PyObject *type, *blank, *inputs;
        PyObject *spec = PyTuple_GET_ITEM(specs, i);
        if (!PyTuple_Check(spec)
            || !PyArg_ParseTuple(spec, "OOO!", &type, &blank, &PyTuple_Type, &inputs))
            goto failed;
        if (!PyType_Check(type) || (PyObject *)Py_TYPE(blank) != type
            || !slots_only((PyTypeObject *)type) || PyTuple_GET_SIZE(inputs) > MAX_FIELDS
            || (b->at = slot_offset_in(type, "at")) < 0) {
            PyErr_SetString(PyExc_TypeError, "configure_commands: a slotted class and its blank");
            goto failed;
        }
        b->type = Py_NewRef(type);
        b->blank = Py_NewRef(blank);
        all->n = i + 1;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(inputs); j++) {
            PyObject *name;
            int converted;
            if (!PyArg_ParseTuple(PyTuple_GET_ITEM(inputs, j), "Up", &name, &converted))
                goto failed;
            const char *text = PyUnicode_AsUTF8(name);
            if (text == NULL)
                goto failed;
            if ((b->slot[j] = slot_offset_in(type, text)) < 0) {
                PyErr_Format(PyExc_TypeError, "configure_commands: no slot %U", name);
                goto failed;
            }
            b->alias[j] = Py_NewRef(name);
            b->converted[j] = converted;
            b->n = j + 1;
        }
    }
    records_free(st->commands);
    st->commands = all;
    Py_RETURN_NONE;
failed:
    records_free(all);
    return NULL;
}

/* record(cls, /, *args, **fields): cls(*args, **fields) for a class
 * register_record accepted (a slotted attrs class whose __init__ only
 * stores its arguments, a constant default where one is missing): a copy
 * of its blank instance (the defaults) with the arguments set, no
 * __init__ run.  Any call it does not build exactly so (an unregistered
 * class, too many positional arguments, an unknown or repeated keyword, a
 * required field missing) is the call cls(*args, **fields) itself, which
 * words the error. */

static Py_ssize_t
field_of(record_spec *r, PyObject *keyword)
{
    for (Py_ssize_t j = 0; j < r->n; j++)
        if (r->alias[j] == keyword)
            return j;
    if (!PyUnicode_CheckExact(keyword))  /* a str subclass's own __eq__ decides: the call */
        return -1;
    for (Py_ssize_t j = 0; j < r->n; j++)  /* an exact str not interned */
        if (PyUnicode_Compare(r->alias[j], keyword) == 0)
            return j;
    return -1;
}

static PyObject *
record(PyObject *module, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "record(cls, /, *args, **fields): no class given");
        return NULL;
    }
    records *all = ((module_state *)PyModule_GetState(module))->records;
    PyObject *cls = args[0];
    Py_ssize_t given = nargs - 1, named = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    record_spec *r = NULL;
    for (Py_ssize_t i = 0; all != NULL && i < all->n; i++)
        if (all->of[i].type == cls)
            r = &all->of[i];
    if (r == NULL || given > r->positional || named > r->n)
        goto declined;
    /* The whole call matched to fields before anything is made: a declined
     * call allocates nothing (no instance to finalize). */
    Py_ssize_t field[MAX_FIELDS];
    char set[MAX_FIELDS] = {0};
    memset(set, 1, (size_t)given);
    for (Py_ssize_t k = 0; k < named; k++) {
        Py_ssize_t j = field_of(r, PyTuple_GET_ITEM(kwnames, k));
        if (j < 0 || set[j])  /* unknown, or given twice */
            goto declined;
        set[j] = 1;
        field[k] = j;
    }
    for (Py_ssize_t j = 0; j < r->n; j++)
        if (!set[j] && SLOT(r->blank, r->slot[j]) == NULL)  /* required, not given */
            goto declined;
    PyObject *new = slot_copy(r->blank);
    if (new == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < given; j++)
        Py_XSETREF(SLOT(new, r->slot[j]), Py_NewRef(args[1 + j]));
    for (Py_ssize_t k = 0; k < named; k++)
        Py_XSETREF(SLOT(new, r->slot[field[k]]), Py_NewRef(args[1 + given + k]));
    return new;
declined:
    return PyObject_Vectorcall(cls, args + 1, given, kwnames);
}

/* register_record(cls, blank, fields, positional): fields is ((alias,
 * slot name), ...) in __init__'s order, the first `positional` of them
 * taken by position; blank an instance of cls whose slots hold the
 * defaults (unset where a field is required). */
static PyObject *
register_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyType_Check(args[0]) || (PyObject *)Py_TYPE(args[1]) != args[0]
        || !PyTuple_Check(args[2]) || !PyLong_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "register_record(cls, blank, fields, positional): a class, its blank, "
                        "a tuple and an int");
        return NULL;
    }
    module_state *st = PyModule_GetState(module);
    PyObject *type = args[0], *fields = args[2];
    Py_ssize_t positional = PyLong_AsSsize_t(args[3]);
    if (positional == -1 && PyErr_Occurred())
        return NULL;
    if (!slots_only((PyTypeObject *)type) || PyTuple_GET_SIZE(fields) > MAX_FIELDS
        || positional < 0 || positional > PyTuple_GET_SIZE(fields)) {
        PyErr_SetString(PyExc_TypeError, "register_record: a slotted class of at most 24 fields");
        return NULL;
    }
    if (st->records == NULL && (st->records = PyMem_Calloc(1, sizeof(records))) == NULL)
        return PyErr_NoMemory();
    records *all = st->records;
    for (Py_ssize_t i = 0; i < all->n; i++)
        if (all->of[i].type == type) {
            PyErr_SetString(PyExc_TypeError, "register_record: registered already");
            return NULL;
        }
    if (all->n == MAX_RECORDS) {
        PyErr_SetString(PyExc_TypeError, "register_record: at most 32 classes");
        return NULL;
    }
    record_spec spec = {.positional = positional};
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(fields); j++) {
        PyObject *alias, *name;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fields, j), "UU", &alias, &name))
            return NULL;
        const char *text = PyUnicode_AsUTF8(name);
        if (text == NULL)
            return NULL;
        if ((spec.slot[j] = slot_offset_in(type, text)) < 0) {
            PyErr_Format(PyExc_TypeError, "register_record: no slot %U", name);
            return NULL;
        }
        spec.alias[j] = alias;
        spec.n = j + 1;
    }
    record_spec *r = &all->of[all->n];
    *r = spec;
    r->type = Py_NewRef(type);
    r->blank = Py_NewRef(args[1]);
    for (Py_ssize_t j = 0; j < r->n; j++)
        Py_INCREF(r->alias[j]);
    all->n++;
    Py_RETURN_NONE;
}

/* dumps(value): the compact JSON text _json.dumps makes (the stdlib C
 * encoder with ensure_ascii=False, allow_nan=False and "," ":"), written
 * into one buffer, for JSON data of exact built-in types and the frozen
 * containers whose every str is ASCII; anything else (a non-ASCII or a
 * str subclass, a non-str key, a non-finite float, a LayeredDict, an int
 * past the digit limit, nesting at C_DEPTH_MAX) returns NotImplemented:
 * the stdlib encoder then decides and words the error.  Only exact types
 * are walked, so no method of the data runs; int's repr may run a Python
 * signal handler, which may shrink a list (read again at each item) or
 * raise (raised). */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} text_buffer;

static int
reserve(text_buffer *b, Py_ssize_t more)
{
    if (more <= b->cap - b->len)
        return 0;
    if (more > PY_SSIZE_T_MAX - 64 - b->len) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t need = b->len + more + 64;
    Py_ssize_t cap = b->cap < PY_SSIZE_T_MAX / 2 && b->cap * 2 > need ? b->cap * 2 : need;
    char *data = PyMem_Realloc(b->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static int
put_bytes(text_buffer *b, const char *bytes, Py_ssize_t n)
{
    if (reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, bytes, (size_t)n);
    b->len += n;
    return 0;
}

/* Whether c (below ' ', or '"' or '\\') is written as a two-byte escape. */
static int
short_escape(unsigned char c)
{
    switch (c) {
    case '"': case '\\': case '\b': case '\f': case '\n': case '\r': case '\t':
        return 1;
    default:
        return 0;
    }
}

/* 1: not ours to write (declined), 0: written, -1: an error is set. */
static int
put_text(text_buffer *b, PyObject *s)
{
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(s) < 0)
        return -1;
#endif
    if (!PyUnicode_IS_ASCII(s))
        return 1;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s), size = n + 2;
    const unsigned char *p = PyUnicode_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++)  /* the escapes' extra bytes: reserve what is written */
        if (p[i] < ' ' || p[i] == '"' || p[i] == '\\')
            size += short_escape(p[i]) ? 1 : 5;
    if (reserve(b, size) < 0)
        return -1;
    char *out = b->data + b->len;
    *out++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (c >= ' ' && c != '"' && c != '\\') {
            *out++ = (char)c;
            continue;
        }
        *out++ = '\\';
        switch (c) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '\b': *out++ = 'b'; break;
        case '\f': *out++ = 'f'; break;
        case '\n': *out++ = 'n'; break;
        case '\r': *out++ = 'r'; break;
        case '\t': *out++ = 't'; break;
        default:
            *out++ = 'u';
            *out++ = '0';
            *out++ = '0';
            *out++ = Py_hexdigits[c >> 4];
            *out++ = Py_hexdigits[c & 0xf];
        }
    }
    *out++ = '"';
    b->len = out - b->data;
    return 0;
}

/* The repr of an exact int or float, as the stdlib encoder writes it. */
static int
put_repr(text_buffer *b, PyObject *v)
{
    PyObject *text = Py_TYPE(v)->tp_repr(v);
    if (text == NULL) {
        /* an int past the digit limit (ValueError): the stdlib words it;
         * anything else (a signal handler's KeyboardInterrupt, run by int's
         * repr) is raised */
        if (!PyErr_ExceptionMatches(PyExc_ValueError))
            return -1;
        PyErr_Clear();
        return 1;
    }
    int r = put_bytes(b, (const char *)PyUnicode_DATA(text), PyUnicode_GET_LENGTH(text));
    Py_DECREF(text);
    return r;
}

static int put_value(module_state *st, text_buffer *b, PyObject *v, int depth);

static int
put_items(module_state *st, text_buffer *b, PyObject *v, int depth)
{
    /* an exact list or tuple, or a FrozenList: the items its base stores */
    int tuple = PyTuple_Check(v);
    int r = put_bytes(b, "[", 1);
    /* the size read at each item: int's repr checks for signals, and a
     * Python signal handler may shrink the list */
    for (Py_ssize_t i = 0; r == 0 && i < (tuple ? PyTuple_GET_SIZE(v) : PyList_GET_SIZE(v)); i++) {
        if (i > 0 && (r = put_bytes(b, ",", 1)) != 0)
            break;
        PyObject *item = Py_NewRef(tuple ? PyTuple_GET_ITEM(v, i) : PyList_GET_ITEM(v, i));
        r = put_value(st, b, item, depth + 1);
        Py_DECREF(item);
    }
    return r != 0 ? r : put_bytes(b, "]", 1);
}

static int
put_mapping(module_state *st, text_buffer *b, PyObject *v, int depth)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    int r = put_bytes(b, "{", 1), first = 1;
    while (r == 0 && PyDict_Next(v, &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key))
            return 1;  /* the stdlib converts or refuses other keys */
        Py_INCREF(key);
        Py_INCREF(value);
        if (!first)
            r = put_bytes(b, ",", 1);
        first = 0;
        if (r == 0)
            r = put_text(b, key);
        if (r == 0)
            r = put_bytes(b, ":", 1);
        if (r == 0)
            r = put_value(st, b, value, depth + 1);
        Py_DECREF(key);
        Py_DECREF(value);
    }
    return r != 0 ? r : put_bytes(b, "}", 1);
}

static int
put_value(module_state *st, text_buffer *b, PyObject *v, int depth)
{
    PyObject *t = (PyObject *)Py_TYPE(v);
    if (depth >= C_DEPTH_MAX)
        return 1;
    if (t == (PyObject *)&PyUnicode_Type)
        return put_text(b, v);
    if (v == Py_None)
        return put_bytes(b, "null", 4);
    if (v == Py_True)
        return put_bytes(b, "true", 4);
    if (v == Py_False)
        return put_bytes(b, "false", 5);
    if (t == (PyObject *)&PyLong_Type)
        return put_repr(b, v);
    if (t == (PyObject *)&PyFloat_Type)
        return isfinite(PyFloat_AS_DOUBLE(v)) ? put_repr(b, v) : 1;
    int mapping = t == (PyObject *)&PyDict_Type || t == st->frozen_dict;
    if (!mapping && t != (PyObject *)&PyList_Type && t != (PyObject *)&PyTuple_Type
        && t != st->frozen_list)
        return 1;
    /* the stdlib encoder counts each container against the recursion
     * limit: decline where it would raise RecursionError */
    if (Py_EnterRecursiveCall(" while encoding a JSON object")) {
        PyErr_Clear();
        return 1;
    }
    int r = mapping ? put_mapping(st, b, v, depth) : put_items(st, b, v, depth);
    Py_LeaveRecursiveCall();
    return r;
}

/* put_value of a whole value, counted against the recursion limit as the
 * stdlib encoder's own call is: 0, 1 (declined) or -1. */
static int
put_top(module_state *st, text_buffer *b, PyObject *v)
{
    if (Py_EnterRecursiveCall(" while encoding a JSON object")) {
        PyErr_Clear();
        return 1;
    }
    int r = put_value(st, b, v, 0);
    Py_LeaveRecursiveCall();
    return r;
}

/* The buffer's ASCII text as a new str. */
static PyObject *
buffer_text(text_buffer *b)
{
    PyObject *out = PyUnicode_New(b->len, 127);
    if (out != NULL)
        memcpy(PyUnicode_DATA(out), b->data, (size_t)b->len);
    return out;
}

static PyObject *
dumps(PyObject *module, PyObject *value)
{
    module_state *st = PyModule_GetState(module);
    if (st->frozen_dict == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "dumps: configure() was not called");
        return NULL;
    }
    text_buffer b = {NULL, 0, 0};
    int r = put_top(st, &b, value);
    PyObject *out = r == 0 ? buffer_text(&b) : r == 1 ? Py_NewRef(DECLINE) : NULL;
    PyMem_Free(b.data);
    return out;
}

/* -- a SQL store's head, field by field ------------------------------------
 *
 * _layout.head_fields for an exact record type: each field's text
 * '"name":value', re-encoded only where the record holds another object
 * than the previous record did.  A field whose value put_value declines is
 * the Python fallback's text, so every error and every non-ASCII text is
 * the Python code's own. */

#define HEAD_MAX 64
enum { HEAD_PLAIN = 0, HEAD_SLOT = 1, HEAD_BUDGET = 2 };

struct head_spec {
    PyObject *type, *budget_type;
    PyObject *keys;      /* tuple: '"name":' */
    PyObject *fixed;     /* tuple: a slot field's whole text, else None */
    PyObject *budget;    /* tuple: '{"quota":', ',"used":', ',"reservations":...}' */
    PyObject *fallback;  /* fallback(i, value) -> the field's text */
    Py_ssize_t n, offsets[HEAD_MAX], quota, used;
    int kinds[HEAD_MAX];
};

/* A spec's owned references, each listed once by its refs function; its
 * traverse and free walk them. */
#define MAX_REFS 8
typedef int (*refs_fn)(void *spec, PyObject **refs[MAX_REFS]);

static int
spec_visit(void *spec, refs_fn list, visitproc visit, void *arg)
{
    if (spec == NULL)
        return 0;
    PyObject **refs[MAX_REFS];
    for (int i = 0, n = list(spec, refs); i < n; i++)
        Py_VISIT(*refs[i]);
    return 0;
}

static void
spec_free(void *spec, refs_fn list)
{
    if (spec == NULL)
        return;
    PyObject **refs[MAX_REFS];
    for (int i = 0, n = list(spec, refs); i < n; i++)
        Py_CLEAR(*refs[i]);
    PyMem_Free(spec);
}

/* A new (take) or a released reference to each of a spec's objects: a
 * copy of the spec is then safe to use while Python code reconfigures. */
static void
spec_hold(void *spec, refs_fn list, int take)
{
    PyObject **refs[MAX_REFS];
    for (int i = 0, n = list(spec, refs); i < n; i++) {
        if (take)
            Py_XINCREF(*refs[i]);
        else
            Py_XDECREF(*refs[i]);
    }
}

static int
head_refs(void *spec, PyObject **refs[MAX_REFS])
{
    head_spec *h = spec;
    PyObject **all[] = {&h->type, &h->budget_type, &h->keys, &h->fixed, &h->budget, &h->fallback};
    _Static_assert(sizeof all / sizeof all[0] <= MAX_REFS, "MAX_REFS");
    memcpy(refs, all, sizeof all);
    return (int)(sizeof all / sizeof all[0]);
}

static int
ascii_tuple(PyObject *t, Py_ssize_t n, int none_ok)
{
    if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != n)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = PyTuple_GET_ITEM(t, i);
        if (none_ok && s == Py_None)
            continue;
        if (!PyUnicode_CheckExact(s) || !PyUnicode_IS_ASCII(s))
            return 0;
    }
    return 1;
}

static PyObject *
configure_head(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *st = called(module, nargs, 8,
                              "configure_head(type, budget_type, names, kinds, keys, fixed, "
                              "budget, fallback)");
    if (st == NULL)
        return NULL;
    PyObject *type = args[0], *budget_type = args[1], *names = args[2], *kinds = args[3];
    if (!PyType_Check(type) || !PyType_Check(budget_type) || !PyTuple_CheckExact(names)
        || !PyTuple_CheckExact(kinds) || PyTuple_GET_SIZE(names) > HEAD_MAX
        || PyTuple_GET_SIZE(kinds) != PyTuple_GET_SIZE(names) || !PyCallable_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "configure_head: bad arguments");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (!ascii_tuple(args[4], n, 0) || !ascii_tuple(args[5], n, 1) || !ascii_tuple(args[6], 3, 0)) {
        PyErr_SetString(PyExc_TypeError, "configure_head: keys, fixed or budget texts");
        return NULL;
    }
    head_spec *h = PyMem_Calloc(1, sizeof(head_spec));
    if (h == NULL)
        return PyErr_NoMemory();
    h->n = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        const char *text = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
        long kind = PyLong_Check(PyTuple_GET_ITEM(kinds, i))
                        ? PyLong_AsLong(PyTuple_GET_ITEM(kinds, i)) : -1;
        h->offsets[i] = text == NULL ? -1 : slot_offset_in(type, text);
        h->kinds[i] = (int)kind;
        if (h->offsets[i] < 0 || kind < HEAD_PLAIN || kind > HEAD_BUDGET
            || (kind == HEAD_SLOT && PyTuple_GET_ITEM(args[5], i) == Py_None)) {
            PyErr_Clear();
            PyMem_Free(h);
            PyErr_Format(PyExc_TypeError, "configure_head: field %zd is not a slot of its kind", i);
            return NULL;
        }
    }
    h->quota = slot_offset_in(budget_type, "quota");
    h->used = slot_offset_in(budget_type, "used");
    if (h->quota < 0 || h->used < 0) {
        PyMem_Free(h);
        PyErr_SetString(PyExc_TypeError, "configure_head: budget_type has no quota/used slots");
        return NULL;
    }
    h->type = Py_NewRef(type);
    h->budget_type = Py_NewRef(budget_type);
    h->keys = Py_NewRef(args[4]);
    h->fixed = Py_NewRef(args[5]);
    h->budget = Py_NewRef(args[6]);
    h->fallback = Py_NewRef(args[7]);
    head_spec *old = st->head;
    st->head = h;  /* before the old one's references go: they may run __del__ */
    spec_free(old, head_refs);
    Py_RETURN_NONE;
}

static int
put_str(text_buffer *b, PyObject *ascii)
{
    return put_bytes(b, (const char *)PyUnicode_DATA(ascii), PyUnicode_GET_LENGTH(ascii));
}

/* The budget as {"quota":Q,"used":U,"reservations":...}: 0, 1 (declined), -1. */
static int
put_budget(module_state *st, head_spec *h, text_buffer *b, PyObject *v)
{
    if ((PyObject *)Py_TYPE(v) != h->budget_type)
        return 1;
    PyObject *quota = SLOT(v, h->quota), *used = SLOT(v, h->used);
    if (quota == NULL || used == NULL)
        return 1;
    Py_INCREF(quota);
    Py_INCREF(used);
    int r = put_str(b, PyTuple_GET_ITEM(h->budget, 0));
    if (r == 0)
        r = put_value(st, b, quota, 1);
    if (r == 0)
        r = put_str(b, PyTuple_GET_ITEM(h->budget, 1));
    if (r == 0)
        r = put_value(st, b, used, 1);
    if (r == 0)
        r = put_str(b, PyTuple_GET_ITEM(h->budget, 2));
    Py_DECREF(quota);
    Py_DECREF(used);
    return r;
}

/* Field i's text for value v (a new reference), or NULL with an error set. */
static PyObject *
field_text(module_state *st, head_spec *h, text_buffer *b, Py_ssize_t i, PyObject *v)
{
    if (h->kinds[i] == HEAD_SLOT)
        return Py_NewRef(PyTuple_GET_ITEM(h->fixed, i));
    b->len = 0;
    int r = put_str(b, PyTuple_GET_ITEM(h->keys, i));
    if (r == 0) {
        r = h->kinds[i] == HEAD_BUDGET ? put_budget(st, h, b, v) : put_top(st, b, v);
    }
    if (r < 0)
        return NULL;
    if (r == 1) {
        PyObject *at = PyLong_FromSsize_t(i);
        if (at == NULL)
            return NULL;
        PyObject *text = PyObject_CallFunctionObjArgs(h->fallback, at, v, NULL);
        Py_DECREF(at);
        if (text != NULL && !PyUnicode_CheckExact(text)) {
            Py_DECREF(text);
            PyErr_SetString(PyExc_TypeError, "head_fields: the fallback returned no str");
            return NULL;
        }
        return text;
    }
    return buffer_text(b);
}

static PyObject *
head_fields_held(module_state *st, head_spec *h, PyObject **values, PyObject **before,
                 PyObject *fields)
{
    /* as the Python code: list(fields), then the fields that changed */
    PyObject *out = before != NULL ? PySequence_List(fields) : PyList_New(h->n);
    if (out == NULL)
        return NULL;
    text_buffer b = {NULL, 0, 0};
    for (Py_ssize_t i = 0; i < h->n; i++) {
        if (before != NULL && values[i] == before[i])
            continue;
        PyObject *text = field_text(st, h, &b, i, values[i]);
        if (text == NULL) {
            PyMem_Free(b.data);
            Py_DECREF(out);
            return NULL;
        }
        if (before != NULL)
            Py_SETREF(PyList_GET_ITEM(out, i), text);  /* out is ours alone */
        else
            PyList_SET_ITEM(out, i, text);
    }
    PyMem_Free(b.data);
    return out;
}

static PyObject *
head_fields(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *st = called(module, nargs, 3, "head_fields(record, previous, fields)");
    if (st == NULL)
        return NULL;
    PyObject *record = args[0], *previous = args[1], *fields = args[2];
    if (st->head == NULL || (PyObject *)Py_TYPE(record) != st->head->type)
        return Py_NewRef(DECLINE);
    int tuple = PyTuple_CheckExact(fields);
    if (!tuple && !PyList_CheckExact(fields))
        return Py_NewRef(DECLINE);
    Py_ssize_t had = tuple ? PyTuple_GET_SIZE(fields) : PyList_GET_SIZE(fields);
    /* as the Python code: the previous fields only with a previous record */
    int incremental = previous != Py_None && had > 0;
    if (incremental && ((PyObject *)Py_TYPE(previous) != st->head->type || had != st->head->n))
        return Py_NewRef(DECLINE);
    /* Everything read before any Python code runs (a fallback may change
     * the record, the fields or the configuration), as attrgetter and
     * list(fields) do for the Python code. */
    head_spec h = *st->head;
    PyObject *values[HEAD_MAX], *before[HEAD_MAX];
    for (Py_ssize_t i = 0; i < h.n; i++)  /* an unset slot: Python raises */
        if (SLOT(record, h.offsets[i]) == NULL
            || (incremental && SLOT(previous, h.offsets[i]) == NULL))
            return Py_NewRef(DECLINE);
    for (Py_ssize_t i = 0; i < h.n; i++) {
        values[i] = Py_NewRef(SLOT(record, h.offsets[i]));
        before[i] = incremental ? Py_NewRef(SLOT(previous, h.offsets[i])) : NULL;
    }
    spec_hold(&h, head_refs, 1);
    Py_INCREF(fields);
    PyObject *out = head_fields_held(st, &h, values, incremental ? before : NULL, fields);
    Py_DECREF(fields);
    spec_hold(&h, head_refs, 0);
    for (Py_ssize_t i = 0; i < h.n; i++) {
        Py_DECREF(values[i]);
        Py_XDECREF(before[i]);
    }
    return out;
}

/* -- a SQL store's diff: the common commit ---------------------------------
 *
 * _diff.diff when every keyed part is the remembered one or derived from
 * it by the kernel (its lineage names the keys that moved) and each list is
 * the remembered one or the remembered one with items appended; anything
 * else (a reload, an edit, a NUL in a key, a type set by hand) is declined
 * before anything is returned, and the Python code decides. */

#define DIFF_KEYED 3
#define DIFF_LISTS 2

struct diff_spec {
    PyObject *entry_type, *keyed_type, *record_type, *budget_type;
    PyObject *parts;       /* tuple: the keyed parts' names */
    PyObject *lists;       /* tuple: the list parts' names */
    PyObject *make_entry;  /* make_entry(record, keyed x 3, messages, usage) */
    PyObject *encode;      /* encode(value) -> JSON text, raising as the store refuses */
    Py_ssize_t entry_at[1 + DIFF_KEYED + DIFF_LISTS];  /* record, keyed..., lists... */
    Py_ssize_t record_at[DIFF_KEYED + DIFF_LISTS];     /* intents, tool_results, budget, lists */
    Py_ssize_t reservations_at, source_at, keys_at, values_at;
};

static int
diff_refs(void *spec, PyObject **refs[MAX_REFS])
{
    diff_spec *d = spec;
    PyObject **all[] = {&d->entry_type, &d->keyed_type, &d->record_type, &d->budget_type,
                        &d->parts, &d->lists, &d->make_entry, &d->encode};
    _Static_assert(sizeof all / sizeof all[0] <= MAX_REFS, "MAX_REFS");
    memcpy(refs, all, sizeof all);
    return (int)(sizeof all / sizeof all[0]);
}

static PyObject *
configure_diff(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *st = called(module, nargs, 8,
                              "configure_diff(entry_type, keyed_type, record_type, budget_type, "
                              "parts, lists, make_entry, encode)");
    if (st == NULL)
        return NULL;
    static const char *const entry_names[] = {"record", "intents", "tool_results",
                                              "reservations", "messages", "usage"};
    static const char *const record_names[] = {"intents", "tool_results", "budget",
                                               "transcript", "usage"};
    for (int i = 0; i < 4; i++)
        if (!PyType_Check(args[i]))
            goto bad;
    if (!ascii_tuple(args[4], DIFF_KEYED, 0) || !ascii_tuple(args[5], DIFF_LISTS, 0)
        || !PyCallable_Check(args[6]) || !PyCallable_Check(args[7]))
        goto bad;
    diff_spec *d = PyMem_Calloc(1, sizeof(diff_spec));
    if (d == NULL)
        return PyErr_NoMemory();
    int ok = offsets_of(args[0], entry_names, 1 + DIFF_KEYED + DIFF_LISTS, d->entry_at) == 0
             && offsets_of(args[2], record_names, DIFF_KEYED + DIFF_LISTS, d->record_at) == 0;
    d->reservations_at = ok ? slot_offset_in(args[3], "reservations") : -1;
    d->source_at = ok ? slot_offset_in(args[1], "source") : -1;
    d->keys_at = ok ? slot_offset_in(args[1], "_keys") : -1;
    d->values_at = ok ? slot_offset_in(args[1], "_values") : -1;
    if (d->reservations_at < 0 || d->source_at < 0 || d->keys_at < 0 || d->values_at < 0) {
        PyMem_Free(d);
        PyErr_Clear();
        goto bad;
    }
    d->entry_type = Py_NewRef(args[0]);
    d->keyed_type = Py_NewRef(args[1]);
    d->record_type = Py_NewRef(args[2]);
    d->budget_type = Py_NewRef(args[3]);
    d->parts = Py_NewRef(args[4]);
    d->lists = Py_NewRef(args[5]);
    d->make_entry = Py_NewRef(args[6]);
    d->encode = Py_NewRef(args[7]);
    diff_spec *old = st->diff;
    st->diff = d;
    spec_free(old, diff_refs);
    Py_RETURN_NONE;
bad:
    PyErr_SetString(PyExc_TypeError, "configure_diff: bad arguments");
    return NULL;
}

/* encode(value) of the store: the accelerator's text, else the Python one. */
static PyObject *
encoded(module_state *st, diff_spec *d, text_buffer *b, PyObject *value)
{
    b->len = 0;
    int r = put_top(st, b, value);
    if (r < 0)
        return NULL;
    return r == 1 ? PyObject_CallOneArg(d->encode, value) : buffer_text(b);
}

static int
append_row(PyObject *rows, PyObject *part, PyObject *key, PyObject *text)
{
    PyObject *row = text == NULL ? PyTuple_Pack(2, part, key) : PyTuple_Pack(3, part, key, text);
    if (row == NULL)
        return -1;
    int r = PyList_Append(rows, row);
    Py_DECREF(row);
    return r;
}

/* The keys a kernel derivation moved from old to new (a new dict, keys in
 * first-moved order); DECLINE (new) when the lineage does not say; NULL. */
static PyObject *
moved_keys(module_state *st, PyObject *old, PyObject *new)
{
    PyObject *to = (PyObject *)Py_TYPE(old), *tn = (PyObject *)Py_TYPE(new);
    if ((to != st->frozen_dict && to != st->layered_dict)
        || (tn != st->frozen_dict && tn != st->layered_dict))
        return Py_NewRef(DECLINE);
    int bad = 0;
    PyObject *a = lineage_of(old, to == st->layered_dict ? st->ld_lineage : st->fd_lineage, &bad);
    PyObject *b = lineage_of(new, tn == st->layered_dict ? st->ld_lineage : st->fd_lineage, &bad);
    if (a == NULL || b == NULL || bad || PyTuple_GET_ITEM(a, 0) != PyTuple_GET_ITEM(b, 0))
        return Py_NewRef(DECLINE);
    PyObject *log = PyTuple_GET_ITEM(a, 0);
    Py_ssize_t from = PyLong_AsSsize_t(PyTuple_GET_ITEM(a, 1));
    Py_ssize_t to_version = PyLong_AsSsize_t(PyTuple_GET_ITEM(b, 1));
    if (from < 0 || to_version < from)
        return Py_NewRef(DECLINE);
    PyObject *keys = PyDict_New();
    if (keys == NULL)
        return NULL;
    Py_INCREF(log);
    for (Py_ssize_t i = from; i < to_version && i < PyList_GET_SIZE(log); i++) {
        PyObject *key = PyList_GET_ITEM(log, i);
        if (!PyUnicode_CheckExact(key) || PyUnicode_FindChar(key, 0, 0, PY_SSIZE_T_MAX, 1) != -1) {
            /* a key set by hand, or one the Python code refuses (NUL) */
            Py_DECREF(log);
            Py_DECREF(keys);
            return Py_NewRef(DECLINE);
        }
        if (PyDict_SetItem(keys, key, Py_None) < 0) {
            Py_DECREF(log);
            Py_DECREF(keys);
            return NULL;
        }
    }
    Py_DECREF(log);
    return keys;
}

/* A new _Keyed of source (no aligned lists yet). */
static PyObject *
new_keyed(diff_spec *d, PyObject *source)
{
    PyTypeObject *t = (PyTypeObject *)d->keyed_type;
    PyObject *k = t->tp_alloc(t, 0);
    if (k == NULL)
        return NULL;
    SLOT(k, d->source_at) = Py_NewRef(source);
    SLOT(k, d->keys_at) = Py_NewRef(Py_None);
    SLOT(k, d->values_at) = Py_NewRef(Py_None);
    return k;
}

/* Whether m is a mapping lookup() reads (a LayeredDict as its class lays it out). */
static int
readable(module_state *st, PyObject *m)
{
    PyObject *base, *over;
    Py_ssize_t length;
    return (PyObject *)Py_TYPE(m) == st->frozen_dict
           || ((PyObject *)Py_TYPE(m) == st->layered_dict && layers_of(st, m, &base, &over, &length));
}

/* Keyed part old_keyed -> new, decided before anything is encoded: None
 * (unchanged), the keys that moved (a new dict), DECLINE (new) or NULL;
 * *source: old_keyed's map (a new reference) unless declined. */
static PyObject *
keyed_moves(module_state *st, diff_spec *d, PyObject *old_keyed, PyObject *new, PyObject **source)
{
    if ((PyObject *)Py_TYPE(old_keyed) != d->keyed_type || SLOT(old_keyed, d->source_at) == NULL)
        return Py_NewRef(DECLINE);
    PyObject *old = SLOT(old_keyed, d->source_at);
    *source = Py_NewRef(old);
    if (new == old)
        return Py_NewRef(Py_None);
    if (!readable(st, old) || !readable(st, new))
        return Py_NewRef(DECLINE);
    return moved_keys(st, old, new);
}

/* The rows of the moved keys of old -> new: 0, 1 (declined) or -1. */
static int
keyed_rows(module_state *st, diff_spec *d, text_buffer *buf, PyObject *part, PyObject *old,
           PyObject *new, PyObject *moved, PyObject *upserts, PyObject *deletes)
{
    Py_ssize_t pos = 0;
    PyObject *key, *unused;
    int failed = 0;
    while (!failed && PyDict_Next(moved, &pos, &key, &unused)) {
        int how = OK;
        PyObject *value = lookup(st, new, key, &how), *was = NULL;
        if (how == OK)
            was = lookup(st, old, key, &how);
        if (how != OK)
            failed = how == FAIL ? -1 : 1;
        else if (value == NULL) {
            if (was != NULL && append_row(deletes, part, key, NULL) < 0)
                failed = -1;
        }
        else if (was != value) {
            PyObject *text = encoded(st, d, buf, value);
            failed = text == NULL || append_row(upserts, part, key, text) < 0 ? -1 : 0;
            Py_XDECREF(text);
        }
        Py_XDECREF(value);
        Py_XDECREF(was);
    }
    return failed;
}

/* The items of an exact list or tuple or a FrozenList (whose methods are
 * list's: its storage is what the Python code reads), or NULL. */
static PyObject **
items_of(module_state *st, PyObject *v, Py_ssize_t *n)
{
    if (PyList_CheckExact(v) || PyTuple_CheckExact(v) || (PyObject *)Py_TYPE(v) == st->frozen_list) {
        *n = PySequence_Fast_GET_SIZE(v);
        return PySequence_Fast_ITEMS(v);
    }
    return NULL;
}

/* Whether new is old (None: empty) with items appended: 0, or 1 (declined). */
static int
appended_to(module_state *st, PyObject *old, PyObject *new)
{
    if (new == old)
        return 0;
    Py_ssize_t n_old = 0, n_new;
    PyObject **before = NULL, **after = items_of(st, new, &n_new);
    if (after == NULL || (old != Py_None && (before = items_of(st, old, &n_old)) == NULL)
        || n_new < n_old)
        return 1;
    for (Py_ssize_t j = 0; j < n_old; j++)
        if (before[j] != after[j])
            return 1;  /* an edit: the Python code compares */
    return 0;
}

/* The rows of the items new has past old's: 0 or -1. */
static int
list_rows(module_state *st, diff_spec *d, text_buffer *buf, PyObject *part, PyObject *old,
          PyObject *new, PyObject *upserts)
{
    if (new == old)
        return 0;
    Py_ssize_t from = old == Py_None ? 0 : PySequence_Fast_GET_SIZE(old);
    /* the size read at each item: an encode may run Python code */
    for (Py_ssize_t j = from; j < PySequence_Fast_GET_SIZE(new); j++) {
        char digits[32];
        snprintf(digits, sizeof digits, "%010zd", j);
        PyObject *key = PyUnicode_FromString(digits);
        PyObject *item = Py_NewRef(PySequence_Fast_GET_ITEM(new, j));
        PyObject *text = key == NULL ? NULL : encoded(st, d, buf, item);
        int r = text == NULL || append_row(upserts, part, key, text) < 0 ? -1 : 0;
        Py_XDECREF(text);
        Py_XDECREF(key);
        Py_DECREF(item);
        if (r < 0)
            return -1;
    }
    return 0;
}

#define DIFF_OLD (1 + DIFF_KEYED + DIFF_LISTS)
#define DIFF_NEW (DIFF_KEYED + DIFF_LISTS)

/* The diff of held (strong) references: the decisions first, then the
 * encoding, so a decline comes before any Python code runs. */
static PyObject *
diff_held(module_state *st, diff_spec *d, PyObject **olds, PyObject **news)
{
    PyObject *out = NULL, *moved[DIFF_KEYED] = {NULL, NULL, NULL};
    PyObject *sources[DIFF_KEYED] = {NULL, NULL, NULL};
    PyObject *keyed[DIFF_KEYED] = {NULL, NULL, NULL}, *upserts = NULL, *deletes = NULL;
    text_buffer buf = {NULL, 0, 0};
    int r = 0;
    for (int i = 0; r == 0 && i < DIFF_KEYED; i++) {
        moved[i] = keyed_moves(st, d, olds[1 + i], news[i], &sources[i]);
        r = moved[i] == NULL ? -1 : moved[i] == DECLINE ? 1 : 0;
    }
    for (int i = 0; r == 0 && i < DIFF_LISTS; i++)
        r = appended_to(st, olds[1 + DIFF_KEYED + i], news[DIFF_KEYED + i]);
    if (r == 0 && ((upserts = PyList_New(0)) == NULL || (deletes = PyList_New(0)) == NULL))
        r = -1;
    for (int i = 0; r == 0 && i < DIFF_KEYED; i++) {
        if (moved[i] == Py_None) {
            keyed[i] = Py_NewRef(olds[1 + i]);
            continue;
        }
        r = keyed_rows(st, d, &buf, PyTuple_GET_ITEM(d->parts, i), sources[i], news[i], moved[i],
                       upserts, deletes);
        if (r == 0 && (keyed[i] = new_keyed(d, news[i])) == NULL)
            r = -1;
    }
    for (int i = 0; r == 0 && i < DIFF_LISTS; i++)
        r = list_rows(st, d, &buf, PyTuple_GET_ITEM(d->lists, i), olds[1 + DIFF_KEYED + i],
                      news[DIFF_KEYED + i], upserts);
    if (r == 1)
        out = Py_NewRef(DECLINE);
    else if (r == 0) {
        PyObject *made[] = {news[DIFF_NEW], keyed[0], keyed[1], keyed[2], news[3], news[4]};
        PyObject *entry = PyObject_Vectorcall(d->make_entry, made, 6, NULL);
        if (entry != NULL)
            out = PyTuple_Pack(3, entry, upserts, deletes);
        Py_XDECREF(entry);
    }
    PyMem_Free(buf.data);
    for (int i = 0; i < DIFF_KEYED; i++) {
        Py_XDECREF(keyed[i]);
        Py_XDECREF(moved[i]);
        Py_XDECREF(sources[i]);
    }
    Py_XDECREF(upserts);
    Py_XDECREF(deletes);
    return out;
}

static PyObject *
diff_fast(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *st = called(module, nargs, 2, "diff(entry, record)");
    if (st == NULL)
        return NULL;
    PyObject *entry = args[0], *record = args[1];
    diff_spec *d = st->diff;
    if (d == NULL || (PyObject *)Py_TYPE(entry) != d->entry_type
        || (PyObject *)Py_TYPE(record) != d->record_type)
        return Py_NewRef(DECLINE);
    /* olds: the entry's record, keyed parts and lists; news: the record's
     * keyed parts (the budget's reservations third), lists, then the record */
    PyObject *olds[DIFF_OLD], *news[DIFF_NEW + 1];
    for (int i = 0; i < DIFF_OLD; i++)
        if ((olds[i] = SLOT(entry, d->entry_at[i])) == NULL)
            return Py_NewRef(DECLINE);
    for (int i = 0; i < DIFF_NEW; i++)
        if ((news[i] = SLOT(record, d->record_at[i])) == NULL)
            return Py_NewRef(DECLINE);
    PyObject *budget = news[2];
    if ((PyObject *)Py_TYPE(budget) != d->budget_type
        || (news[2] = SLOT(budget, d->reservations_at)) == NULL)
        return Py_NewRef(DECLINE);
    news[DIFF_NEW] = record;
    /* Everything held before any Python code runs: an encode may change the
     * entry, the record or the configuration. */
    diff_spec held = *d;
    spec_hold(&held, diff_refs, 1);
    for (int i = 0; i < DIFF_OLD; i++)
        Py_INCREF(olds[i]);
    for (int i = 0; i <= DIFF_NEW; i++)
        Py_INCREF(news[i]);
    PyObject *out = diff_held(st, &held, olds, news);
    for (int i = 0; i < DIFF_OLD; i++)
        Py_DECREF(olds[i]);
    for (int i = 0; i <= DIFF_NEW; i++)
        Py_DECREF(news[i]);
    spec_hold(&held, diff_refs, 0);
    return out;
}

/* -- the store's commit checks ------------------------------------------ */

/* Whether v is an exact int a long long holds (then *out), no error set. */
static int
exact_long_long(PyObject *v, long long *out)
{
    if (!PyLong_CheckExact(v))
        return 0;
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow != 0 || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* An exact int in [low, high) (high may be any exact int: no Python code runs). */
static int
int_within(PyObject *v, long long low, PyObject *high)
{
    long long n;
    if (!exact_long_long(v, &n) || n < low)
        return 0;
    int below = PyObject_RichCompareBool(v, high, Py_LT);
    if (below < 0) {
        PyErr_Clear();
        return 0;
    }
    return below;
}

/* An exact str of 1..max ASCII characters without NUL. */
static int
ascii_text(PyObject *v, Py_ssize_t max)
{
    if (!PyUnicode_CheckExact(v) || !PyUnicode_IS_ASCII(v))
        return 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(v);
    return n > 0 && n <= max && memchr(PyUnicode_DATA(v), 0, (size_t)n) == NULL;
}

/* _fields.is_time: a finite float, or an exact int within +-exact_int. */
static int
is_time_value(PyObject *v, long long exact_int)
{
    if (PyFloat_CheckExact(v))
        return isfinite(PyFloat_AS_DOUBLE(v));
    long long n;
    return exact_long_long(v, &n) && -exact_int <= n && n <= exact_int;
}

/* A slot's value (borrowed) by its member descriptor's offset, or NULL. */
static PyObject *
slot_value(PyObject *obj, Py_ssize_t offset)
{
    return offset < 0 ? NULL : SLOT(obj, offset);
}

enum { C_RUN_ID, C_INCARNATION, C_REVISION, C_TYPE, C_AT };

/* The slot offsets commit_checked reads (-1 where a type has none), found
 * when the types differ from the last call's. */
static void
check_offsets(module_state *st, PyObject *record_type, PyObject *event_type)
{
    if (st->check_record == record_type && st->check_event == event_type)
        return;
    Py_XSETREF(st->check_record, Py_NewRef(record_type));
    Py_XSETREF(st->check_event, Py_NewRef(event_type));
    st->check_at[C_RUN_ID] = slot_offset_in(record_type, "run_id");
    st->check_at[C_INCARNATION] = slot_offset_in(record_type, "incarnation");
    st->check_at[C_REVISION] = slot_offset_in(record_type, "revision");
    st->check_at[C_TYPE] = slot_offset_in(event_type, "type");
    st->check_at[C_AT] = slot_offset_in(event_type, "occurred_at");
}

/* commit_checked(record_type, event_type, max_run_id, max_int, exact_int,
 *                run_id, incarnation, expected_revision, record, events) -> bool
 *
 * True when _protocol.check_arguments(run_id, incarnation=...,
 * expected_revision=..., events=...) and every check of
 * _protocol.check_commit but those against the stored record pass, for exact
 * types only; False otherwise (the Python checks then decide and word the
 * error).  Reads slots and exact built-ins alone: no Python code runs. */
static PyObject *
commit_checked(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "commit_checked takes 10 arguments");
        return NULL;
    }
    PyObject *record_type = args[0], *event_type = args[1], *max_int = args[3];
    PyObject *run_id = args[5], *incarnation = args[6], *expected = args[7];
    PyObject *record = args[8], *events = args[9];
    if (!PyType_Check(record_type) || !PyType_Check(event_type) || !PyLong_CheckExact(args[2])
        || !PyLong_CheckExact(max_int) || !PyLong_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError, "commit_checked: two types and exact int limits");
        return NULL;
    }
    Py_ssize_t max_run_id = PyLong_AsSsize_t(args[2]);
    if (max_run_id == -1 && PyErr_Occurred())
        return NULL;
    long long exact_int = PyLong_AsLongLong(args[4]);
    if (exact_int == -1 && PyErr_Occurred())
        return NULL;
    if (!ascii_text(run_id, max_run_id) || !int_within(incarnation, 1, max_int)
        || !int_within(expected, 0, max_int)
        || !(PyTuple_CheckExact(events) || PyList_CheckExact(events))
        || (PyObject *)Py_TYPE(record) != record_type)
        Py_RETURN_FALSE;
    module_state *st = PyModule_GetState(module);
    check_offsets(st, record_type, event_type);
    Py_ssize_t *at = st->check_at;
    PyObject *r_run_id = slot_value(record, at[C_RUN_ID]);
    PyObject *r_incarnation = slot_value(record, at[C_INCARNATION]);
    PyObject *r_revision = slot_value(record, at[C_REVISION]);
    if (r_run_id == NULL || r_incarnation == NULL || r_revision == NULL
        || !PyUnicode_CheckExact(r_run_id) || !PyLong_CheckExact(r_incarnation)
        || !PyLong_CheckExact(r_revision))
        Py_RETURN_FALSE;
    /* run_id, incarnation and expected are exact and in range: these compare
     * without Python code */
    long long inc = PyLong_AsLongLong(incarnation), rev = PyLong_AsLongLong(expected);
    long long r_inc, r_rev;
    if (!exact_long_long(r_incarnation, &r_inc) || !exact_long_long(r_revision, &r_rev)
        || r_inc != inc || rev == LLONG_MAX || r_rev != rev + 1)
        Py_RETURN_FALSE;
    int same = PyUnicode_Compare(r_run_id, run_id);
    if (same != 0) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(events);
    PyObject **items = PySequence_Fast_ITEMS(events);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *event = items[i];
        if ((PyObject *)Py_TYPE(event) != event_type)
            Py_RETURN_FALSE;
        PyObject *kind = slot_value(event, at[C_TYPE]), *when = slot_value(event, at[C_AT]);
        if (kind == NULL || when == NULL || !ascii_text(kind, PY_SSIZE_T_MAX)
            || !is_time_value(when, exact_int))
            Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"freeze", (PyCFunction)(void (*)(void))freeze, METH_FASTCALL,
     "freeze(value, limit, /)\n--\n\n"
     "The frozen copy of JSON data of exact built-in types, or NotImplemented."},
    {"copy_slots", copy_slots, METH_O,
     "copy_slots(obj, /)\n--\n\n"
     "A new instance of type(obj) with the same slot values (no __init__ run)."},
    {"grown", (PyCFunction)(void (*)(void))grown, METH_FASTCALL,
     "grown(items, more, /)\n--\n\n"
     "A new FrozenList of the items of items, then those of more."},
    {"put", (PyCFunction)(void (*)(void))put, METH_FASTCALL,
     "put(mapping, key, value, layer_from, overlay_max, /)\n--\n\n"
     "_derived.put for a FrozenDict or a LayeredDict, or NotImplemented."},
    {"transition", (PyCFunction)(void (*)(void))transition, METH_FASTCALL,
     "transition(record, command, revision, layer_from, overlay_max, /)\n--\n\n"
     "_transition.transition of the four hot commands, or NotImplemented."},
    {"configure_transition", (PyCFunction)(void (*)(void))configure_transition, METH_FASTCALL,
     "configure_transition(record_type, budget_type, event, unset, key_summaries, "
     "item_summaries, max_depth, record_depth, commands, /)\n--\n\n"
     "The kernel's types, helpers and command layouts transition works with."},
    {"command", (PyCFunction)(void (*)(void))command, METH_FASTCALL,
     "command(cls, at, fields, /)\n--\n\n"
     "cls(at=at, **fields) for a configured command class, or NotImplemented."},
    {"configure_commands", configure_commands, METH_O,
     "configure_commands(specs, /)\n--\n\n"
     "The command classes command builds: (cls, blank, ((field, converted), ...))."},
    {"configure_head", (PyCFunction)(void (*)(void))configure_head, METH_FASTCALL,
     "configure_head(type, budget_type, names, kinds, keys, fixed, budget, fallback, /)\n--\n\n"
     "The record type head_fields encodes, and how each of its fields is written."},
    {"head_fields", (PyCFunction)(void (*)(void))head_fields, METH_FASTCALL,
     "head_fields(record, previous, fields, /)\n--\n\n"
     "_layout.head_fields of a configured record type, or NotImplemented."},
    {"configure_diff", (PyCFunction)(void (*)(void))configure_diff, METH_FASTCALL,
     "configure_diff(entry_type, keyed_type, record_type, budget_type, parts, lists, "
     "make_entry, encode, /)\n--\n\n"
     "The types and helpers diff works with."},
    {"diff", (PyCFunction)(void (*)(void))diff_fast, METH_FASTCALL,
     "diff(entry, record, /)\n--\n\n"
     "_diff.diff of the common commit (entry, upserts, deletes), or NotImplemented."},
    {"commit_checked", (PyCFunction)(void (*)(void))commit_checked, METH_FASTCALL,
     "commit_checked(record_type, event_type, max_run_id, max_int, exact_int, run_id, "
     "incarnation, expected_revision, record, events, /)\n--\n\n"
     "Whether a store commit's arguments certainly pass the store's checks (False: "
     "run them)."},
    {"dumps", dumps, METH_O,
     "dumps(value, /)\n--\n\n"
     "_json.dumps of JSON data whose every str is ASCII, or NotImplemented."},
    {"record", (PyCFunction)(void (*)(void))record, METH_FASTCALL | METH_KEYWORDS,
     "record(cls, /, *args, **fields)\n--\n\n"
     "cls(*args, **fields), built as a copy of a registered class's blank instance."},
    {"register_record", (PyCFunction)(void (*)(void))register_record, METH_FASTCALL,
     "register_record(cls, blank, fields, positional, /)\n--\n\n"
     "A class record builds: its blank, ((keyword, slot name), ...) and how many by position."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "configure(frozen_dict, frozen_list, layered_dict, lineage_max, /)\n--\n\n"
     "The types the accelerator builds and keeps, and the lineage limit."},
    {NULL, NULL, 0, NULL},
};

static int
module_traverse(PyObject *module, visitproc visit, void *arg)
{
    module_state *st = PyModule_GetState(module);
    Py_VISIT(st->frozen_dict);
    Py_VISIT(st->frozen_list);
    Py_VISIT(st->layered_dict);
    Py_VISIT(st->check_record);
    Py_VISIT(st->check_event);
    int failed = kernel_traverse(st->kernel, visit, arg);
    failed = failed ? failed : records_traverse(st->commands, visit, arg);
    failed = failed ? failed : spec_visit(st->head, head_refs, visit, arg);
    failed = failed ? failed : spec_visit(st->diff, diff_refs, visit, arg);
    return failed ? failed : records_traverse(st->records, visit, arg);
}

static int
module_clear(PyObject *module)
{
    module_state *st = PyModule_GetState(module);
    Py_CLEAR(st->frozen_dict);
    Py_CLEAR(st->frozen_list);
    Py_CLEAR(st->layered_dict);
    Py_CLEAR(st->check_record);
    Py_CLEAR(st->check_event);
    kernel_free(st->kernel);
    st->kernel = NULL;
    records_free(st->commands);
    st->commands = NULL;
    records_free(st->records);
    st->records = NULL;
    spec_free(st->head, head_refs);
    st->head = NULL;
    spec_free(st->diff, diff_refs);
    st->diff = NULL;
    return 0;
}

static void
module_free(void *module)
{
    module_clear((PyObject *)module);
}

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "trio_backplane.kernel._speedups",
    .m_doc = "C accelerator for the kernel: freeze, copy_slots, grown, put, transition.",
    .m_size = sizeof(module_state),
    .m_methods = methods,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModuleDef_Init(&moduledef);
}
