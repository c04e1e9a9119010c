/*
 * pending.c - engramstore._engram.PendingLookup: a lookup submitted ahead
 * of time (engram_lookup_submit, engram_ngram_lookup_submit), returned by
 * Store.lookup_async() and NgramHasher.submit().
 *
 * The object holds what the library reads and writes until the lookup is
 * done: the arrays (their buffer exports, so that no one can resize or
 * free them) and the objects whose C state the lookup uses (the hasher).
 * wait() and cancel() release the GIL while they block.  An object
 * dropped without either is cancelled, and its arrays are released only
 * once the lookup can no longer touch them.
 */
#include "pystore.h"

#include <errno.h>
#include <string.h>

#define MAX_HELD 4

typedef struct {
    PyObject_HEAD
    engram_pending *p; /* NULL once waited for or cancelled */
    ext_array held[MAX_HELD];
    int nheld;
    int ids_index;     /* held[ids_index] names bad ids, or -1 */
    const char *ids_arg;
    int lead;
    PyObject *keep;    /* objects the lookup's C state belongs to, or NULL */
    PyObject *result;  /* what wait() returns (the output made), or NULL: None */
} PendingObject;

static PyTypeObject *pending_type;

static void release_held(PendingObject *o)
{
    for (int i = 0; i < o->nheld; i++)
        ext_array_release(&o->held[i]);
    o->nheld = 0;
    Py_CLEAR(o->keep);
}

/* Waits (cancel: cancels first) and turns the outcome into Python's:
 * 1 (cancel only: it was cancelled before it ran), 0, or -1 with an
 * exception. */
static int finish(PendingObject *o, int cancel)
{
    engram_pending *p = o->p;
    int rc;
    if (!p) {
        ext_raise_cls(ext_exc_for(ENGRAM_ESTATE), ENGRAM_ESTATE,
                      "this lookup was already waited for or cancelled");
        return -1;
    }
    o->p = NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = cancel ? engram_lookup_cancel(p) : engram_lookup_wait(p);
    Py_END_ALLOW_THREADS
    if (rc == -ECANCELED && cancel) {
        release_held(o);
        return 1;
    }
    if (rc == ENGRAM_EBADID && o->ids_index >= 0)
        ext_store_raise_bad_id(rc, &o->held[o->ids_index], o->ids_arg, o->lead);
    else if (rc)
        ext_raise(rc, NULL);
    release_held(o);
    return rc ? -1 : 0;
}

PyDoc_STRVAR(wait_doc,
"wait($self, /)\n--\n\n"
"Waits for the lookup to finish (the GIL released meanwhile) and raises what\n"
"lookup() would have raised (BadIdError naming the id, ...).  Returns what\n"
"lookup() would have returned: None, or the output it made when out was\n"
"omitted.  Once only.");

static PyObject *Pending_wait(PendingObject *o, PyObject *unused)
{
    PyObject *r = o->result;
    (void)unused;
    o->result = NULL; /* returned once; never the rows of a failed lookup */
    if (finish(o, 0) < 0) {
        Py_XDECREF(r);
        return NULL;
    }
    return r ? r : Py_NewRef(Py_None);
}

PyDoc_STRVAR(cancel_doc,
"cancel($self, /)\n--\n\n"
"Cancels the lookup if it has not started (True: the output was not touched);\n"
"else waits for it as wait() does (False).  Once only, instead of wait().");

static PyObject *Pending_cancel(PendingObject *o, PyObject *unused)
{
    int r;
    (void)unused;
    Py_CLEAR(o->result);
    if ((r = finish(o, 1)) < 0)
        return NULL;
    return PyBool_FromLong(r == 1);
}

PyDoc_STRVAR(done_doc,
"done($self, /)\n--\n\n"
"True if wait() would not block (or was called already).");

static PyObject *Pending_done(PendingObject *o, PyObject *unused)
{
    (void)unused;
    return PyBool_FromLong(!o->p || engram_lookup_done(o->p) == 1);
}

static void Pending_dealloc(PendingObject *o)
{
    PyTypeObject *tp = Py_TYPE(o);
    if (o->p) {
        /* Not waited for: it must stop touching the arrays before they go. */
        engram_pending *p = o->p;
        o->p = NULL;
        Py_BEGIN_ALLOW_THREADS
        (void)engram_lookup_cancel(p);
        Py_END_ALLOW_THREADS
    }
    release_held(o);
    Py_CLEAR(o->result);
    tp->tp_free(o);
    Py_DECREF(tp);
}

static PyMethodDef Pending_methods[] = {
    {"wait", (PyCFunction)Pending_wait, METH_NOARGS, wait_doc},
    {"cancel", (PyCFunction)Pending_cancel, METH_NOARGS, cancel_doc},
    {"done", (PyCFunction)Pending_done, METH_NOARGS, done_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(Pending_doc,
"A lookup running on the store's lookup threads: wait() for its rows, or\n"
"cancel() it.  Made by lookup_async() and NgramHasher.submit().");

static PyType_Slot Pending_slots[] = {
    {Py_tp_dealloc, Pending_dealloc},
    {Py_tp_methods, Pending_methods},
    {Py_tp_doc, (void *)(uintptr_t)Pending_doc},
    {0, NULL},
};

static PyType_Spec Pending_spec = {
    .name = "engramstore._engram.PendingLookup",
    .basicsize = sizeof(PendingObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = Pending_slots,
};

PyObject *ext_pending_new(engram_pending *p, ext_array *held, int nheld, int ids_index,
                          const char *ids_arg, int lead, PyObject *keep, PyObject *result)
{
    PendingObject *o = PyObject_New(PendingObject, pending_type);
    if (!o) {
        /* The lookup must end before the arrays go. */
        Py_BEGIN_ALLOW_THREADS
        (void)engram_lookup_cancel(p);
        Py_END_ALLOW_THREADS
        for (int i = 0; i < nheld; i++)
            ext_array_release(&held[i]);
        return NULL;
    }
    o->p = p;
    o->nheld = nheld;
    for (int i = 0; i < nheld; i++) {
        o->held[i] = held[i];
        memset(&held[i], 0, sizeof held[i]); /* moved */
    }
    o->ids_index = ids_index;
    o->ids_arg = ids_arg;
    o->lead = lead;
    o->keep = Py_XNewRef(keep);
    o->result = Py_XNewRef(result);
    return (PyObject *)o;
}

int ext_pending_init(PyObject *m)
{
    PyObject *t = PyType_FromSpec(&Pending_spec);
    if (!t)
        return -1;
    if (PyModule_AddObjectRef(m, "PendingLookup", t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    pending_type = (PyTypeObject *)t; /* the module's reference keeps it */
    Py_DECREF(t);
    return 0;
}
