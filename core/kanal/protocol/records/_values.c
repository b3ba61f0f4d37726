/* The record walk of kanal.protocol.records.values, compiled.
 *
 * record_values(b, p, count, end, loads, error, fallback) walks `count` records of a v2 batch's
 * records area from b[p] to b[end] and answers the list of their values: loads(value bytes), or
 * fallback(value bytes) when loads raised `error`, or None for a null value. The walk is the one
 * of values.python_record_values, which is the reference: every read stays below the end of its
 * record (or of the records area), and a walk that does not add up raises ValueError. Client
 * bytes come through here, so nothing is read before its bound is checked.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* The zigzag varint at b[*p], read below `limit`; -1 when it does not end there or is longer
 * than 64 bits. */
static int read_zigzag(const unsigned char *b, Py_ssize_t limit, Py_ssize_t *p, int64_t *out)
{
    uint64_t raw = 0;
    int shift = 0;
    Py_ssize_t q = *p;
    for (;;) {
        if (q >= limit || shift > 63)
            return -1;
        unsigned char x = b[q++];
        if (shift == 63 && x > 1)
            return -1; /* more than 64 bits */
        raw |= (uint64_t)(x & 0x7F) << shift;
        if (x < 0x80)
            break;
        shift += 7;
    }
    *p = q;
    *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
    return 0;
}

static PyObject *decoded(PyObject *raw, PyObject *loads, PyObject *error, PyObject *fallback)
{
    PyObject *value = PyObject_CallOneArg(loads, raw);
    if (value == NULL && PyErr_ExceptionMatches(error)) {
        PyErr_Clear();
        value = PyObject_CallOneArg(fallback, raw);
    }
    return value;
}

static PyObject *record_values(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "record_values() takes 7 arguments");
        return NULL;
    }
    Py_ssize_t p = PyLong_AsSsize_t(args[1]);
    Py_ssize_t count = PyLong_AsSsize_t(args[2]);
    Py_ssize_t end = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *loads = args[4], *error = args[5], *fallback = args[6];
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *b = view.buf;
    const char *why = NULL;
    PyObject *out = NULL;
    if (p < 0 || count < 0 || end > view.len || p > end) {
        why = "the records area is out of the buffer";
        goto done;
    }
    out = PyList_New(count);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t n;
        if (read_zigzag(b, end, &p, &n) < 0 || n <= 0 || n > end - p) {
            why = "a record length does not fit the batch";
            goto done;
        }
        Py_ssize_t rend = p + (Py_ssize_t)n;
        p += 1; /* attributes */
        if (read_zigzag(b, rend, &p, &n) < 0 || read_zigzag(b, rend, &p, &n) < 0 ||
            read_zigzag(b, rend, &p, &n) < 0 || (n > 0 && n > rend - p)) {
            why = "a record's deltas or key do not fit its length";
            goto done;
        }
        if (n > 0)
            p += (Py_ssize_t)n;
        if (read_zigzag(b, rend, &p, &n) < 0 || n > rend - p) {
            why = "a record's value does not fit its length";
            goto done;
        }
        PyObject *value;
        if (n < 0) {
            value = Py_NewRef(Py_None);
        }
        else {
            PyObject *raw = PyBytes_FromStringAndSize((const char *)b + p, (Py_ssize_t)n);
            if (raw == NULL)
                goto done;
            value = decoded(raw, loads, error, fallback);
            Py_DECREF(raw);
            if (value == NULL)
                goto done;
            p += (Py_ssize_t)n;
        }
        PyList_SET_ITEM(out, i, value);
        if (p >= rend || (b[p] == 0 && p + 1 != rend)) {
            why = "a record's headers do not fill its length";
            goto done;
        }
        p = rend;
    }
    if (p != end)
        why = "the records do not fill the batch";
done:
    PyBuffer_Release(&view);
    if (why != NULL)
        PyErr_SetString(PyExc_ValueError, why);
    if (PyErr_Occurred()) {
        Py_XDECREF(out);
        return NULL;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"record_values", (PyCFunction)(void (*)(void))record_values, METH_FASTCALL,
     "record_values(b, p, count, end, loads, error, fallback): the decoded value of each record."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kanal.protocol.records._values", "The record walk, compiled.", -1, methods,
};

PyMODINIT_FUNC PyInit__values(void)
{
    return PyModule_Create(&module);
}
