/* C accelerator for trio_backplane.schema._instance.check_python.
 *
 * check(obj, max_depth, max_bytes) -> None | reason
 *
 * Walks obj depth-first in pre-order (dicts in insertion order) with an
 * explicit stack, exactly like check_python, and returns the reason of the
 * first violation ("not_json", "integer_too_large", "input_too_deep",
 * "input_too_large") or None.  The running size is the byte count of
 * json.dumps(obj, ensure_ascii=False, separators=(",", ":")) in UTF-8,
 * accumulated and checked at the same points as the Python reference, so
 * both report the same reason for every input.
 *
 * Only exact built-in types are accepted, so no Python code (no __eq__,
 * __hash__, __iter__, __del__ of the walked data) can run during the walk.
 * Containers on the stack are still held by a strong reference.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define INT_DIGITS_LIMIT 4300   /* as _instance.INT_DIGITS_LIMIT */
#define MAX_DEPTH_CAP 100000    /* largest max_depth accepted */
#define INLINE_FRAMES 32        /* frames kept on the C stack before the heap */

enum { R_NOT_JSON, R_INT_TOO_LARGE, R_TOO_DEEP, R_TOO_LARGE, R_COUNT };
static const char *const reason_names[R_COUNT] = {
    "not_json", "integer_too_large", "input_too_deep", "input_too_large"};

typedef struct {
    PyObject *reasons[R_COUNT];             /* interned reason strings */
    size_t limit_bits;                      /* bit length of 10**4300 */
    PyObject *pow10[INT_DIGITS_LIMIT + 1];  /* 10**k, filled on demand */
} module_state;

/* Bytes a code point below 0x100 costs in the encoding, minus one:
 * `"` `\` \b \f \n \r \t are escaped with two characters, other controls as
 * \u00XX (six), U+0080..U+00FF take two UTF-8 bytes.  Filled at import. */
static unsigned char extra_cost[256];

static void
fill_extra_cost(void)
{
    for (int c = 0; c < 256; c++)
        extra_cost[c] = c >= 0x80 ? 1 : c < 0x20 ? 5 : 0;
    extra_cost['"'] = extra_cost['\\'] = 1;
    extra_cost['\b'] = extra_cost['\f'] = extra_cost['\n'] = 1;
    extra_cost['\r'] = extra_cost['\t'] = 1;
}

/* Whether one of the 8 ASCII bytes in w is a control, `"` or `\`
 * (the usual "has a byte below n" / "has a zero byte" word tricks). */
static inline uint64_t
escapes_in_word(uint64_t w)
{
    const uint64_t ones = 0x0101010101010101ULL, high = ones * 0x80;
    uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
    return (((w - ones * 0x20) & ~w) | ((q - ones) & ~q) | ((b - ones) & ~b)) & high;
}

/* cost plus the extra bytes of n ASCII characters (n >= 16): words without
 * escapes are skipped 8 bytes at a time, the rest is summed from the table.
 * Not inlined: it would make str_cost save registers for short strings. */
static Py_NO_INLINE Py_ssize_t
ascii_cost(const Py_UCS1 *p, Py_ssize_t n, Py_ssize_t cost)
{
    Py_ssize_t i = 0;
    for (uint64_t w; i + 8 <= n; i += 8) {
        memcpy(&w, p + i, 8);
        if (escapes_in_word(w))
            break;
    }
    for (; i < n; i++)
        cost += extra_cost[p[i]];
    return cost;
}

/* Encoded bytes of an exact str, quotes included; -1 for a lone surrogate
 * (any code point in U+D800..U+DFFF: Python strings never pair them); -2
 * with an exception set if a legacy string cannot be made ready. */
static Py_ssize_t
str_cost(PyObject *s)
{
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(s) < 0)  /* legacy wstr strings only */
        return -2;
#endif
    Py_ssize_t n = PyUnicode_GET_LENGTH(s), cost = n + 2;
    const void *data = PyUnicode_DATA(s);
    switch (PyUnicode_KIND(s)) {
    case PyUnicode_1BYTE_KIND: {
        const Py_UCS1 *p = data;
        if (n >= 16 && PyUnicode_IS_ASCII(s))
            return ascii_cost(p, n, cost);
        for (Py_ssize_t i = 0; i < n; i++)
            cost += extra_cost[p[i]];
        break;
    }
    case PyUnicode_2BYTE_KIND: {
        const Py_UCS2 *p = data;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_UCS4 c = p[i];
            if (c < 0x100) cost += extra_cost[c];
            else if (c < 0x800) cost += 1;
            else if (c - 0xD800u < 0x800u) return -1;
            else cost += 2;
        }
        break;
    }
    default: {
        const Py_UCS4 *p = data;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_UCS4 c = p[i];
            if (c < 0x100) cost += extra_cost[c];
            else if (c < 0x800) cost += 1;
            else if (c - 0xD800u < 0x800u) return -1;
            else cost += c < 0x10000 ? 2 : 3;
        }
    }
    }
    return cost;
}

static const unsigned long long pow10_u64[20] = {
    1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL,
    100000000ULL, 1000000000ULL, 10000000000ULL, 100000000000ULL,
    1000000000000ULL, 10000000000000ULL, 100000000000000ULL,
    1000000000000000ULL, 10000000000000000ULL, 100000000000000000ULL,
    1000000000000000000ULL, 10000000000000000000ULL};

/* Decimal digits of an unsigned 64-bit value (at least 1). */
static Py_ssize_t
u64_digits(unsigned long long u)
{
#if defined(__GNUC__) || defined(__clang__)
    /* bits*1233/4096 ~ bits*log10(2): the digit count or one less. */
    int t = ((64 - __builtin_clzll(u | 1)) * 1233) >> 12;
    return t + (t < 20 && (u | 1) >= pow10_u64[t]);  /* u | 1: 0 has a digit */
#else
    Py_ssize_t d = 1;
    while (d < 20 && u >= pow10_u64[d])
        d++;
    return d;
#endif
}

/* 10**k for 19 <= k <= 4300, computed once per k actually met (all of them
 * together would hold about 4 MB). */
static PyObject *
pow10_get(module_state *st, Py_ssize_t k)
{
    if (st->pow10[k] == NULL) {
        PyObject *ten = PyLong_FromLong(10), *e = PyLong_FromSsize_t(k);
        if (ten != NULL && e != NULL)
            st->pow10[k] = PyNumber_Power(ten, e, Py_None);
        Py_XDECREF(ten);
        Py_XDECREF(e);
    }
    return st->pow10[k];
}

/* len(str(v)) of an exact int; -1 when |v| >= 10**4300; -2 with an
 * exception set on an internal error. */
static Py_ssize_t
int_cost(module_state *st, PyObject *v)
{
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (!overflow) {
        if (x == -1 && PyErr_Occurred())
            return -2;
        if (x < 0)
            return 1 + u64_digits(0ULL - (unsigned long long)x);
        return u64_digits((unsigned long long)x);
    }
    size_t nbits = _PyLong_NumBits(v);  /* bit length of |v| */
    if (nbits == (size_t)-1)
        return -2;
    if (nbits > st->limit_bits)  /* |v| >= 2**limit_bits > 10**4300 */
        return -1;
    PyObject *a = overflow < 0 ? PyNumber_Absolute(v) : Py_NewRef(v);
    if (a == NULL)
        return -2;
    Py_ssize_t cost = -2;
    int ge;
    /* Only at the same bit length as 10**4300 does it take a comparison. */
    if (nbits == st->limit_bits) {
        if ((ge = PyObject_RichCompareBool(a, st->pow10[INT_DIGITS_LIMIT], Py_GE)) != 0) {
            cost = ge > 0 ? -1 : -2;
            goto done;
        }
    }
    /* 10**k <= 2**(nbits-1) <= |v| < 10**4300, so |v| has k+1 or k+2 digits
     * and k+1 <= 4300.  (nbits-1)*log10(2) stays more than 1e-5 away from an
     * integer for nbits <= 14286, far above the rounding error of the double. */
    Py_ssize_t k = (Py_ssize_t)((double)(nbits - 1) * 0.30102999566398120);
    PyObject *p = pow10_get(st, k + 1);
    if (p == NULL || (ge = PyObject_RichCompareBool(a, p, Py_GE)) < 0)
        goto done;
    cost = k + 1 + ge + (overflow < 0);
done:
    Py_DECREF(a);
    return cost;
}

/* len(repr(d)) of a finite float. */
static Py_ssize_t
float_cost(double d)
{
    static const double p10[20] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9,
        1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19};
    double m = fabs(d);
    Py_ssize_t sign = signbit(d) != 0;
    if (m < 1e16 && m == floor(m))  /* repr is "<digits>.0" */
        return u64_digits((unsigned long long)m) + 2 + sign;
    /* repr is the shortest decimal that reads back as d, in fixed notation
     * for 1e-4 <= |d| < 1e16.  Try p = 1, 2, ... fractional digits: N/10**p
     * with N < 2**50 reads back as m iff the correctly rounded division
     * N / 10**p (both exact doubles) equals m, and N can only be the integer
     * nearest m*10**p (off by < 1/4 in that range).  The first p that
     * works is the shortest; the integer part is then N / 10**p. */
    if (m >= 1e-4) {
        for (int p = 1; p < 20; p++) {
            double c = m * p10[p];
            if (c >= 1125899906842624.0)  /* 2**50 */
                break;
            double n = floor(c + 0.5);
            if (n / p10[p] == m)
                return u64_digits((unsigned long long)n / pow10_u64[p]) + 1 + p + sign;
        }
    }
    char *s = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (s == NULL)
        return -1;
    Py_ssize_t n = (Py_ssize_t)strlen(s);
    PyMem_Free(s);
    return n;
}

/* One open container: next position, whether it has yielded a member yet. */
typedef struct {
    PyObject *obj;
    Py_ssize_t pos;
    int is_dict;
    int started;
} frame;

/* Read an int argument; huge values become PY_LLONG_MAX/MIN for the range
 * checks below (a huge max_bytes means "no limit"). */
static int
int_arg(PyObject *o, long long *out)
{
    PyObject *i = PyNumber_Index(o);
    if (i == NULL)
        return -1;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(i, &overflow);
    Py_DECREF(i);
    if (overflow)
        *out = overflow > 0 ? PY_LLONG_MAX : PY_LLONG_MIN;
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *
check(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    module_state *st = PyModule_GetState(module);
    long long max_depth, max_bytes;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "check() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    if (int_arg(args[1], &max_depth) < 0 || int_arg(args[2], &max_bytes) < 0)
        return NULL;
    if (max_depth < 1 || max_depth > MAX_DEPTH_CAP) {
        PyErr_Format(PyExc_ValueError, "max_depth must be in 1..%d", MAX_DEPTH_CAP);
        return NULL;
    }
    if (max_bytes < 0) {
        PyErr_SetString(PyExc_ValueError, "max_bytes must be >= 0");
        return NULL;
    }

    frame inline_stack[INLINE_FRAMES], *stack = inline_stack;
    Py_ssize_t depth = 0, cap = INLINE_FRAMES, c;
    long long size = 0;
    int reason = -1;          /* -1: no violation */
    PyObject *value = args[0], *result = NULL;

    for (;;) {
        /* Account for `value` itself (a container: its brackets). */
        if (PyUnicode_CheckExact(value)) {
            if ((c = str_cost(value)) < 0) {
                if (c == -2) goto error;
                reason = R_NOT_JSON;
                break;
            }
            size += c;
        }
        else if (PyDict_CheckExact(value) || PyList_CheckExact(value)) {
            if (depth >= max_depth) { reason = R_TOO_DEEP; break; }
            if (depth == cap) {  /* grow the stack; never past max_depth */
                Py_ssize_t ncap = cap * 2 < max_depth ? cap * 2 : (Py_ssize_t)max_depth;
                frame *ns = PyMem_Malloc(sizeof(frame) * (size_t)ncap);
                if (ns == NULL) { PyErr_NoMemory(); goto error; }
                memcpy(ns, stack, sizeof(frame) * (size_t)depth);
                if (stack != inline_stack)
                    PyMem_Free(stack);
                stack = ns;
                cap = ncap;
            }
            stack[depth++] = (frame){Py_NewRef(value), 0, PyDict_CheckExact(value), 0};
            size += 2;
        }
        else if (PyLong_CheckExact(value)) {
            if ((c = int_cost(st, value)) < 0) {
                if (c == -2) goto error;
                reason = R_INT_TOO_LARGE;
                break;
            }
            size += c;
        }
        else if (PyFloat_CheckExact(value)) {
            double d = PyFloat_AS_DOUBLE(value);
            if (!isfinite(d)) { reason = R_NOT_JSON; break; }
            if ((c = float_cost(d)) < 0) goto error;
            size += c;
        }
        else if (value == Py_True || value == Py_None) size += 4;
        else if (value == Py_False) size += 5;
        else { reason = R_NOT_JSON; break; }

        if (size > max_bytes) { reason = R_TOO_LARGE; break; }

        /* Advance to the next value in pre-order; the comma, key and colon
         * of a dict member count before the member's value is visited. */
        for (;;) {
            if (depth == 0)
                goto finish;
            frame *f = &stack[depth - 1];
            if (f->is_dict) {
                PyObject *key;
                if (PyDict_Next(f->obj, &f->pos, &key, &value)) {
                    size += f->started;
                    f->started = 1;
                    if (!PyUnicode_CheckExact(key) || (c = str_cost(key)) == -1) {
                        reason = R_NOT_JSON;
                        goto finish;
                    }
                    if (c == -2)
                        goto error;
                    size += c + 1;
                    break;
                }
            }
            else if (f->pos < PyList_GET_SIZE(f->obj)) {
                value = PyList_GET_ITEM(f->obj, f->pos);
                size += f->pos++ > 0;
                break;
            }
            Py_DECREF(f->obj);  /* exhausted: close the container */
            depth--;
        }
    }
finish:
    result = reason < 0 ? Py_NewRef(Py_None) : Py_NewRef(st->reasons[reason]);
error:
    while (depth > 0)
        Py_DECREF(stack[--depth].obj);
    if (stack != inline_stack)
        PyMem_Free(stack);
    return result;
}

static PyMethodDef methods[] = {
    {"check", (PyCFunction)(void (*)(void))check, METH_FASTCALL,
     "check(obj, max_depth, max_bytes, /)\n--\n\n"
     "The reason of the first violation check_python finds in obj, or None."},
    {NULL, NULL, 0, NULL},
};

static int
module_exec(PyObject *module)
{
    module_state *st = PyModule_GetState(module);
    fill_extra_cost();
    for (int i = 0; i < R_COUNT; i++)
        if ((st->reasons[i] = PyUnicode_InternFromString(reason_names[i])) == NULL)
            return -1;
    PyObject *limit = pow10_get(st, INT_DIGITS_LIMIT);
    if (limit == NULL)
        return -1;
    st->limit_bits = _PyLong_NumBits(limit);
    return 0;
}

static int
module_traverse(PyObject *module, visitproc visit, void *arg)
{
    module_state *st = PyModule_GetState(module);
    for (int i = 0; i < R_COUNT; i++)
        Py_VISIT(st->reasons[i]);
    return 0;  /* the cached powers of ten are ints: no cycles through them */
}

static int
module_clear(PyObject *module)
{
    module_state *st = PyModule_GetState(module);
    for (int i = 0; i < R_COUNT; i++)
        Py_CLEAR(st->reasons[i]);
    for (int k = 0; k <= INT_DIGITS_LIMIT; k++)
        Py_CLEAR(st->pow10[k]);
    return 0;
}

static void
module_free(void *module)
{
    module_clear((PyObject *)module);
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "trio_backplane.schema._speedups",
    .m_doc = "C accelerator for trio_backplane.schema._instance.check_python.",
    .m_size = sizeof(module_state),
    .m_methods = methods,
    .m_slots = slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModuleDef_Init(&moduledef);
}
