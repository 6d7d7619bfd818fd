/* C accelerator for the kernel: freeze (_frozen), put (_derived), the record copy (_evolve).
 *
 * configure(FrozenDict, FrozenList, LayeredDict, lineage_max) -> None
 * freeze(value, limit) -> frozen value | NotImplemented
 * copy_slots(obj) -> a new instance of type(obj) holding the same slot values
 * grown(items, more) -> a new FrozenList: the items of items, then of more
 * put(mapping, key, value, layer_from, overlay_max) -> derived | NotImplemented
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
#include <math.h>
#include <string.h>
#include <structmember.h>

/* Deeper data goes to the Python walk, which does not recurse past a few
 * dozen levels: the C walk's own recursion stays small. */
#define C_DEPTH_MAX 200

/* 10**4300 has 14285 bits: an int of fewer bits has at most 4300 digits. */
#define INT_BITS_OK 14285

typedef struct {
    PyObject *frozen_dict;
    PyObject *frozen_list;
    PyObject *layered_dict;
    /* slot offsets: FrozenDict._lineage; LayeredDict's _base, _over, _len, _lineage */
    Py_ssize_t fd_lineage, ld_base, ld_over, ld_len, ld_lineage;
    Py_ssize_t lineage_max;
} module_state;

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

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
    PyObject *out = PyObject_CallNoArgs(st->frozen_dict);
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
    PyObject *out = PyObject_CallNoArgs(st->frozen_list);
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
static PyObject *
copy_slots(PyObject *module, PyObject *obj)
{
    PyTypeObject *t = Py_TYPE(obj);
    if (!slots_only(t)) {
        PyErr_SetString(PyExc_TypeError,
                        "copy_slots: only classes with __slots__ over object (no __dict__)");
        return NULL;
    }
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
static PyObject *
grown(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *st = called(module, nargs, 2, "grown(items, more)");
    if (st == NULL)
        return NULL;
    PyObject *items = args[0], *more = args[1];
    if (!(PyList_Check(items) || PyTuple_Check(items)) || !(PyList_Check(more) || PyTuple_Check(more))) {
        PyErr_SetString(PyExc_TypeError, "grown: items and more must be lists or tuples");
        return NULL;
    }
    /* The new list first: an object allocation may run a collection (and a
     * finalizer); the sizes and item arrays are read after it, and nothing
     * between reading and copying them runs Python code. */
    PyObject *out = PyObject_CallNoArgs(st->frozen_list);
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
        base = SLOT(mapping, st->ld_base);
        over = SLOT(mapping, st->ld_over);
        PyObject *length = SLOT(mapping, st->ld_len);
        if (base == NULL || over == NULL || length == NULL || !PyDict_CheckExact(over)
            || (PyObject *)Py_TYPE(base) != st->frozen_dict || !PyLong_CheckExact(length)) {
            Py_XDECREF(lineage);
            return Py_NewRef(DECLINE);
        }
        Py_INCREF(base);
        Py_INCREF(over);
        old_len = PyLong_AsSsize_t(length);
        if (old_len == -1 && PyErr_Occurred()) {
            PyErr_Clear();  /* a length set by hand: the Python code decides */
            new = Py_NewRef(DECLINE);
            goto done;
        }
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
            new = PyObject_CallNoArgs(st->frozen_dict);
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
            new = PyObject_CallNoArgs(st->frozen_dict);
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
    Py_RETURN_NONE;
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
    return 0;
}

static int
module_clear(PyObject *module)
{
    module_state *st = PyModule_GetState(module);
    Py_CLEAR(st->frozen_dict);
    Py_CLEAR(st->frozen_list);
    Py_CLEAR(st->layered_dict);
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
    .m_doc = "C accelerator for the kernel: freeze, copy_slots, grown, put.",
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
