/* The record walk of kanal.protocol.records.values, compiled.
 *
 * One walk (walk_record) reads a record of a v2 batch's records area and checks that it adds up;
 * the functions below answer what their callers need from it:
 *
 * - record_values(b, p, count, end, loads, error, fallback): the values of `count` records from b[p]
 *   to b[end], loads(value bytes), or fallback(value bytes) when loads raised `error`, None for null;
 * - record_spans(b, p, count, end): where each record's parts are (see values.RecordSpan);
 * - skip_records(b, p, count, end): the position after `count` records, by their lengths only;
 * - record_headers(b, p, end): the headers of one record's header section b[p:end];
 * - write_record(out, b, span, value): a walked record appended to `out` with another value;
 * - encode_varint(n): the zigzag varint of a signed 64-bit integer.
 *
 * values.py holds the pure-Python reference of each, held by the tests to the same answers. Client
 * bytes come through here, so nothing is read before its bound is checked, and a walk that does not
 * add up raises ValueError (the caller then hands the batch to the codec).
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

/* The zigzag varint of n in out[0..9]; its length. */
static Py_ssize_t write_zigzag(int64_t n, unsigned char *out)
{
    uint64_t z = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    Py_ssize_t i = 0;
    while (z >= 0x80) {
        out[i++] = (unsigned char)(z | 0x80);
        z >>= 7;
    }
    out[i++] = (unsigned char)z;
    return i;
}

/* One record's parts, as values.RecordSpan lists them. */
typedef struct {
    Py_ssize_t start, body, end;
    int64_t attributes, timestamp_delta, offset_delta;
    Py_ssize_t key, key_end, value, value_end;
    int64_t header_count;
} span_t;

#define SPAN_FIELDS 11

/* The record at b[*p], which must end by `end`: its parts in *r and *p moved past it; NULL, or
 * why it does not walk. The checks are those of the codec's decoder: a positive length within the
 * batch, deltas, key, value and header count within the record, and a record without headers ending
 * right after its header count (the headers themselves are read by record_headers). */
static const char *walk_record(const unsigned char *b, Py_ssize_t end, Py_ssize_t *p, span_t *r)
{
    int64_t n;
    Py_ssize_t q = *p;
    r->start = q;
    if (read_zigzag(b, end, &q, &n) < 0 || n <= 0 || n > end - q)
        return "a record length does not fit the batch";
    Py_ssize_t rend = q + (Py_ssize_t)n;
    r->body = q;
    r->end = rend;
    r->attributes = b[q++]; /* q < rend: the length is positive */
    if (read_zigzag(b, rend, &q, &r->timestamp_delta) < 0 || read_zigzag(b, rend, &q, &r->offset_delta) < 0 ||
        read_zigzag(b, rend, &q, &n) < 0 || n > rend - q)
        return "a record's deltas or key do not fit its length";
    if (n < 0) {
        r->key = -1;
    }
    else {
        r->key = q;
        q += (Py_ssize_t)n;
    }
    r->key_end = q;
    if (read_zigzag(b, rend, &q, &n) < 0 || n > rend - q)
        return "a record's value does not fit its length";
    if (n < 0) {
        r->value = -1;
    }
    else {
        r->value = q;
        q += (Py_ssize_t)n;
    }
    r->value_end = q;
    if (read_zigzag(b, rend, &q, &r->header_count) < 0 || r->header_count < 0 ||
        (r->header_count == 0 && q != rend))
        return "a record's headers do not fill its length";
    *p = rend;
    return NULL;
}

/* The buffer of args[0] and the positions args[1..]: p, then count (when `counted`), then end.
 * -1 with an exception set when they are not integers or not within the buffer. */
static int open_area(PyObject *const *args, int counted, Py_buffer *view, Py_ssize_t *p, Py_ssize_t *count,
                     Py_ssize_t *end)
{
    *p = PyLong_AsSsize_t(args[1]);
    *count = counted ? PyLong_AsSsize_t(args[2]) : 0;
    *end = PyLong_AsSsize_t(args[counted ? 3 : 2]);
    if (PyErr_Occurred())
        return -1;
    if (PyObject_GetBuffer(args[0], view, PyBUF_SIMPLE) < 0)
        return -1;
    if (*p < 0 || *count < 0 || *end > view->len || *p > *end) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "the records area is out of the buffer");
        return -1;
    }
    return 0;
}

static int check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t expected)
{
    if (nargs == expected)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, expected, nargs);
    return -1;
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
    Py_buffer view;
    Py_ssize_t p, count, end;
    if (check_nargs("record_values", nargs, 7) < 0 || open_area(args, 1, &view, &p, &count, &end) < 0)
        return NULL;
    PyObject *loads = args[4], *error = args[5], *fallback = args[6];
    const unsigned char *b = view.buf;
    const char *why = NULL;
    PyObject *out = PyList_New(count);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        span_t r;
        why = walk_record(b, end, &p, &r);
        if (why != NULL)
            goto done;
        PyObject *value;
        if (r.value < 0) {
            value = Py_NewRef(Py_None);
        }
        else {
            PyObject *raw = PyBytes_FromStringAndSize((const char *)b + r.value, r.value_end - r.value);
            if (raw == NULL)
                goto done;
            value = decoded(raw, loads, error, fallback);
            Py_DECREF(raw);
            if (value == NULL)
                goto done;
        }
        PyList_SET_ITEM(out, i, value);
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

static PyObject *span_tuple(const span_t *r)
{
    PyObject *t = PyTuple_New(SPAN_FIELDS);
    if (t == NULL)
        return NULL;
    PyObject *items[SPAN_FIELDS] = {
        PyLong_FromSsize_t(r->start),        PyLong_FromSsize_t(r->body),      PyLong_FromSsize_t(r->end),
        PyLong_FromLongLong(r->attributes),  PyLong_FromLongLong(r->timestamp_delta),
        PyLong_FromLongLong(r->offset_delta), PyLong_FromSsize_t(r->key),      PyLong_FromSsize_t(r->key_end),
        PyLong_FromSsize_t(r->value),        PyLong_FromSsize_t(r->value_end), PyLong_FromLongLong(r->header_count),
    };
    int failed = 0;
    for (int i = 0; i < SPAN_FIELDS; i++) {
        if (items[i] == NULL)
            failed = 1;
        else
            PyTuple_SET_ITEM(t, i, items[i]);
    }
    if (failed) {
        Py_DECREF(t); /* the NULL items are skipped */
        return NULL;
    }
    return t;
}

static PyObject *record_spans(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t p, count, end;
    if (check_nargs("record_spans", nargs, 4) < 0 || open_area(args, 1, &view, &p, &count, &end) < 0)
        return NULL;
    const unsigned char *b = view.buf;
    const char *why = NULL;
    PyObject *out = PyList_New(count);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        span_t r;
        why = walk_record(b, end, &p, &r);
        if (why != NULL)
            goto done;
        PyObject *t = span_tuple(&r);
        if (t == NULL)
            goto done;
        PyList_SET_ITEM(out, i, t);
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

static PyObject *skip_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t p, count, end;
    if (check_nargs("skip_records", nargs, 4) < 0 || open_area(args, 1, &view, &p, &count, &end) < 0)
        return NULL;
    const unsigned char *b = view.buf;
    const char *why = NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t n;
        if (read_zigzag(b, end, &p, &n) < 0 || n <= 0 || n > end - p) {
            why = "a record length does not fit the batch";
            break;
        }
        p += (Py_ssize_t)n;
    }
    PyBuffer_Release(&view);
    if (why != NULL) {
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    return PyLong_FromSsize_t(p);
}

static PyObject *record_headers(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t p, unused, end;
    if (check_nargs("record_headers", nargs, 3) < 0 || open_area(args, 0, &view, &p, &unused, &end) < 0)
        return NULL;
    const unsigned char *b = view.buf;
    const char *why = NULL;
    int64_t count, n;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        goto done;
    if (read_zigzag(b, end, &p, &count) < 0 || count < 0 || count > end - p) {
        why = "a record's header count does not fit its headers";
        goto done;
    }
    for (int64_t i = 0; i < count; i++) {
        if (read_zigzag(b, end, &p, &n) < 0 || n < 0 || n > end - p) {
            why = "a header key is null or does not fit the headers";
            goto done;
        }
        PyObject *key = PyBytes_FromStringAndSize((const char *)b + p, (Py_ssize_t)n);
        if (key == NULL)
            goto done;
        p += (Py_ssize_t)n;
        PyObject *value;
        if (read_zigzag(b, end, &p, &n) < 0 || n > end - p) {
            Py_DECREF(key);
            why = "a header value does not fit the headers";
            goto done;
        }
        if (n < 0) {
            value = Py_NewRef(Py_None);
        }
        else {
            value = PyBytes_FromStringAndSize((const char *)b + p, (Py_ssize_t)n);
            p += (Py_ssize_t)n;
        }
        PyObject *pair = value == NULL ? NULL : PyTuple_Pack(2, key, value);
        Py_DECREF(key);
        Py_XDECREF(value);
        if (pair == NULL)
            goto done;
        int appended = PyList_Append(out, pair);
        Py_DECREF(pair);
        if (appended < 0)
            goto done;
    }
    if (p != end)
        why = "a record's headers do not fill its header section";
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

/* The integer at span[i] as a position; -1 with an exception set. */
static Py_ssize_t span_position(PyObject *span, Py_ssize_t i)
{
    Py_ssize_t v = PyLong_AsSsize_t(PyTuple_GET_ITEM(span, i));
    if (v == -1 && PyErr_Occurred())
        return -1;
    return v;
}

static PyObject *write_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs("write_record", nargs, 4) < 0)
        return NULL;
    PyObject *out = args[0], *span = args[2], *value = args[3];
    if (!PyByteArray_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "write_record() writes to a bytearray");
        return NULL;
    }
    if (!PyTuple_Check(span) || PyTuple_GET_SIZE(span) != SPAN_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "write_record() takes a span of record_spans()");
        return NULL;
    }
    Py_ssize_t body = span_position(span, 1), end = span_position(span, 2);
    Py_ssize_t key_end = span_position(span, 7), value_end = span_position(span, 9);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer src, val = {0};
    if (PyObject_GetBuffer(args[1], &src, PyBUF_SIMPLE) < 0)
        return NULL;
    if (value != Py_None && PyObject_GetBuffer(value, &val, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    PyObject *result = NULL;
    if (body < 0 || body > key_end || key_end > value_end || value_end > end || end > src.len) {
        PyErr_SetString(PyExc_ValueError, "the span is not within the buffer");
        goto done;
    }
    unsigned char length[10], value_length[10];
    Py_ssize_t vl = write_zigzag(value == Py_None ? -1 : (int64_t)val.len, value_length);
    Py_ssize_t size = (key_end - body) + vl + val.len + (end - value_end);
    Py_ssize_t ll = write_zigzag((int64_t)size, length);
    Py_ssize_t at = PyByteArray_GET_SIZE(out);
    if (PyByteArray_Resize(out, at + ll + size) < 0)
        goto done;
    char *w = PyByteArray_AS_STRING(out) + at;
    const char *s = src.buf;
    memcpy(w, length, ll);
    w += ll;
    memcpy(w, s + body, key_end - body);
    w += key_end - body;
    memcpy(w, value_length, vl);
    w += vl;
    if (val.len)
        memcpy(w, val.buf, val.len);
    w += val.len;
    memcpy(w, s + value_end, end - value_end);
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&src);
    if (value != Py_None)
        PyBuffer_Release(&val);
    return result;
}

static PyObject *encode_varint(PyObject *module, PyObject *arg)
{
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    unsigned char out[10];
    return PyBytes_FromStringAndSize((const char *)out, write_zigzag((int64_t)n, out));
}

static PyMethodDef methods[] = {
    {"record_values", (PyCFunction)(void (*)(void))record_values, METH_FASTCALL,
     "record_values(b, p, count, end, loads, error, fallback): the decoded value of each record."},
    {"record_spans", (PyCFunction)(void (*)(void))record_spans, METH_FASTCALL,
     "record_spans(b, p, count, end): where the parts of each record are."},
    {"skip_records", (PyCFunction)(void (*)(void))skip_records, METH_FASTCALL,
     "skip_records(b, p, count, end): the position after count records, by their lengths."},
    {"record_headers", (PyCFunction)(void (*)(void))record_headers, METH_FASTCALL,
     "record_headers(b, p, end): the (key, value) headers of a record's header section."},
    {"write_record", (PyCFunction)(void (*)(void))write_record, METH_FASTCALL,
     "write_record(out, b, span, value): append a walked record to out with another value."},
    {"encode_varint", encode_varint, METH_O, "encode_varint(n): the zigzag varint of a signed 64-bit integer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kanal.protocol.records._values", "The record walk, compiled.", -1, methods,
};

PyMODINIT_FUNC PyInit__values(void)
{
    return PyModule_Create(&module);
}
