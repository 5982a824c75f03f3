/*
 * The one SWIG interface over the public header, for Java and Go. It wraps capi/include/zero/zero.h and nothing
 * else (no core header), and it is deliberately close to C: each language's hand-written layer (org.libzero,
 * package zero) turns it into that language's idiom. What this file decides, the same way for both languages:
 *
 *  - Handles (zero_comm_t*, zero_engine_t*) cross as plain integers (Java long, Go uintptr): the hand-written
 *    layers own them in AutoCloseable / Close()-able objects, which is where lifetime belongs.
 *  - A zero_status_t return becomes the language's error: Java throws (org.libzero.internal.Status.check turns the
 *    code into the matching ZeroException with zero_last_error()'s text, read on the same thread right after the
 *    call); Go returns `error` (*capi.Error, read on the same OS thread: the Go layer locks it around each call).
 *  - Out-parameters are one-element arrays in Java (long[], int[], double[], String[]) and pointers in Go.
 *    Strings libzero allocates (char**) come back as the language's string and are freed here.
 *  - Shapes are long[] / []int64; structs are built by constructors that call their zero_*_init function with
 *    the struct's size, so struct_size is always right and never visible.
 *  - Engine memory (zero_param_data, zero_grad_data) comes back as an address; the layers make a direct
 *    ByteBuffer (Java, directBuffer below) or an unsafe.Slice (Go) over it, without copying.
 *
 * Not wrapped: zero/zero_backend.h (custom communicators and the collective descriptor: SWIG reads the headers it
 * is given, not the ones they include), the log callback (function pointers: a JVM or Go transport is future
 * work), and the allocator hook.
 */
#if defined(SWIGJAVA)
%module ZeroNative
#else
%module capi
#endif

%{
#define ZERO_EXPERIMENTAL_API
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "zero/zero.h"
%}

%include <stdint.i>

#define ZERO_API
#define ZERO_EXPERIMENTAL_API

#if defined(SWIGJAVA)
/* Java has no unsigned 64-bit type: counts and byte sizes are long (they stay far below 2^63). */
%apply int64_t { uint64_t };
#endif

/* ---- Status codes: the language's error ----------------------------------------------------------------------- */
#if defined(SWIGJAVA)
%typemap(jni) zero_status_t "jint"
%typemap(jtype) zero_status_t "int"
%typemap(jstype) zero_status_t "void"
%typemap(out) zero_status_t %{ $result = (jint)$1; %}
%typemap(javaout) zero_status_t { org.libzero.internal.Status.check($jnicall); }
#elif defined(SWIGGO)
%typemap(gotype) zero_status_t "error"
%typemap(imtype) zero_status_t "int32"
%typemap(out) zero_status_t %{ $result = $1; %}
%typemap(goout) zero_status_t %{ $result = newError($1) %}
#endif
/* A status passed in (zero_status_string) stays an integer. */
%apply int32_t { zero_status_t status };

/* ---- Handles and addresses: integers -------------------------------------------------------------------------- */
%define ZERO_INTEGER_POINTER(TYPE)
#if defined(SWIGJAVA)
%typemap(jni) TYPE "jlong"
%typemap(jtype) TYPE "long"
%typemap(jstype) TYPE "long"
%typemap(javain) TYPE "$javainput"
%typemap(javaout) TYPE { return $jnicall; }
%typemap(in) TYPE %{ $1 = ($1_ltype)(intptr_t)$input; %}
%typemap(out) TYPE %{ $result = (jlong)(intptr_t)$1; %}
#elif defined(SWIGGO)
%typemap(gotype) TYPE "uintptr"
%typemap(imtype) TYPE "uintptr"
%typemap(in) TYPE %{ $1 = ($1_ltype)$input; %}
%typemap(out) TYPE %{ $result = (uintptr_t)$1; %}
%typemap(goout) TYPE ""
#endif
%enddef
ZERO_INTEGER_POINTER(zero_comm_t*)
ZERO_INTEGER_POINTER(const zero_comm_t*)
ZERO_INTEGER_POINTER(zero_engine_t*)
ZERO_INTEGER_POINTER(const zero_engine_t*)

/* T** out_x (handles, data addresses): long[1] in Java, *uintptr in Go. */
%define ZERO_OUT_POINTER(TYPE)
#if defined(SWIGJAVA)
%typemap(jni) TYPE "jlongArray"
%typemap(jtype) TYPE "long[]"
%typemap(jstype) TYPE "long[]"
%typemap(javain) TYPE "$javainput"
%typemap(in) TYPE ($*1_ltype temp = NULL) %{
  if (!$input || (*jenv)->GetArrayLength(jenv, $input) < 1) {
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "an out-parameter array of length 1 is needed");
    return $null;
  }
  $1 = &temp;
%}
%typemap(argout) TYPE %{
  {
    jlong value = (jlong)(intptr_t)temp$argnum;
    (*jenv)->SetLongArrayRegion(jenv, $input, 0, 1, &value);
  }
%}
#elif defined(SWIGGO)
%typemap(gotype) TYPE "*uintptr"
%typemap(imtype) TYPE "*uintptr"
%typemap(in) TYPE %{ $1 = ($1_ltype)$input; %}
#endif
%enddef
ZERO_OUT_POINTER(zero_comm_t** out_comm)
ZERO_OUT_POINTER(zero_engine_t** out_engine)
ZERO_OUT_POINTER(void** out_data)

/* Scalar out-parameters: int[1] / double[1] in Java, *int32 / *float64 in Go. */
%define ZERO_OUT_SCALAR(CTYPE, NAME, JNITYPE, JNIARRAY, JARRAY, SETTER, GOPOINTER)
#if defined(SWIGJAVA)
%typemap(jni) CTYPE* NAME #JNIARRAY
%typemap(jtype) CTYPE* NAME JARRAY
%typemap(jstype) CTYPE* NAME JARRAY
%typemap(javain) CTYPE* NAME "$javainput"
%typemap(in) CTYPE* NAME (CTYPE temp = 0) %{
  if (!$input || (*jenv)->GetArrayLength(jenv, $input) < 1) {
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "an out-parameter array of length 1 is needed");
    return $null;
  }
  $1 = &temp;
%}
%typemap(argout) CTYPE* NAME %{
  {
    JNITYPE value = (JNITYPE)temp$argnum;
    (*jenv)->SETTER(jenv, $input, 0, 1, &value);
  }
%}
#elif defined(SWIGGO)
%typemap(gotype) CTYPE* NAME GOPOINTER
%typemap(imtype) CTYPE* NAME GOPOINTER
%typemap(in) CTYPE* NAME %{ $1 = ($1_ltype)$input; %}
#endif
%enddef
ZERO_OUT_SCALAR(int32_t, out_rank, jint, jintArray, "int[]", SetIntArrayRegion, "*int32")
ZERO_OUT_SCALAR(int32_t, out_size, jint, jintArray, "int[]", SetIntArrayRegion, "*int32")
ZERO_OUT_SCALAR(int32_t, out_param, jint, jintArray, "int[]", SetIntArrayRegion, "*int32")
ZERO_OUT_SCALAR(int32_t, out_group, jint, jintArray, "int[]", SetIntArrayRegion, "*int32")
ZERO_OUT_SCALAR(double, out_scale, jdouble, jdoubleArray, "double[]", SetDoubleArrayRegion, "*float64")

/* Strings. Java: JNI's own string functions speak "modified UTF-8" (characters outside the BMP become surrogate
 * pairs, NUL two bytes), which is not the UTF-8 libzero checks for; so strings cross as byte arrays that Java encodes
 * and decodes itself (org.libzero.internal.Strings), and a NUL inside a Java string is refused there. Go strings are
 * UTF-8 bytes already (the Go layer refuses an embedded NUL). */
#if defined(SWIGJAVA)
%typemap(jni) const char* "jbyteArray"
%typemap(jtype) const char* "byte[]"
%typemap(jstype) const char* "String"
%typemap(javain) const char* "org.libzero.internal.Strings.toC($javainput)"
%typemap(in) const char* %{
  $1 = NULL;
  if ($input) {
    jsize n = (*jenv)->GetArrayLength(jenv, $input); /* toC ends it with its NUL */
    $1 = (char*)malloc((size_t)n + 1);
    if (!$1) {
      SWIG_JavaThrowException(jenv, SWIG_JavaOutOfMemoryError, "no memory for a string argument");
      return $null;
    }
    (*jenv)->GetByteArrayRegion(jenv, $input, 0, n, (jbyte*)$1);
    $1[n] = '\0';
  }
%}
%typemap(freearg) const char* %{ free((char*)$1); %}
%typemap(out) const char* %{
  $result = NULL;
  if ($1) {
    jsize n = (jsize)strlen($1);
    $result = (*jenv)->NewByteArray(jenv, n);
    if ($result) (*jenv)->SetByteArrayRegion(jenv, $result, 0, n, (const jbyte*)$1);
  }
%}
%typemap(javaout) const char* { return org.libzero.internal.Strings.fromC($jnicall); }
#endif

/* char** out_x: a string libzero allocated, copied into the language's string and freed with zero_string_destroy. */
%define ZERO_OUT_STRING(NAME)
#if defined(SWIGJAVA)
%typemap(jni) char** NAME "jobjectArray"
%typemap(jtype) char** NAME "byte[][]"
%typemap(jstype) char** NAME "byte[][]"
%typemap(javain) char** NAME "$javainput"
%typemap(in) char** NAME (char* temp = NULL) %{
  if (!$input || (*jenv)->GetArrayLength(jenv, $input) < 1) {
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "an out-parameter array of length 1 is needed");
    return $null;
  }
  $1 = &temp;
%}
%typemap(argout) char** NAME %{
  if (temp$argnum) {
    jsize n = (jsize)strlen(temp$argnum);
    jbyteArray bytes = (*jenv)->NewByteArray(jenv, n);
    if (bytes) (*jenv)->SetByteArrayRegion(jenv, bytes, 0, n, (const jbyte*)temp$argnum);
    zero_string_destroy(temp$argnum);
    if (!bytes) return $null; /* OutOfMemoryError pending */
    (*jenv)->SetObjectArrayElement(jenv, $input, 0, bytes);
  }
%}
#elif defined(SWIGGO)
%typemap(gotype) char** NAME "*string"
%typemap(imtype) char** NAME "*string"
%typemap(in) char** NAME (char* temp = NULL) %{ $1 = &temp; %}
%typemap(argout, fragment="AllocateString") char** NAME %{
  if (temp$argnum) {
    *$input = Swig_AllocateString(temp$argnum, strlen(temp$argnum));
    zero_string_destroy(temp$argnum);
  }
%}
%typemap(goargout, fragment="CopyString") char** NAME %{
  if *$input != "" {
    *$input = swigCopyString(*$input)
  }
%}
#endif
%enddef
ZERO_OUT_STRING(out_report)
ZERO_OUT_STRING(out_json)

/* Shapes: (const long long* shape, int32_t ndim) from long[] / []int64. (long long, not int64_t: SWIG's stdint.i
 * spells int64_t as long long, C's as long, and the generated casts must match the C function.) */
#if defined(SWIGJAVA)
%typemap(jni) (const long long* shape, int32_t ndim) "jlongArray"
%typemap(jtype) (const long long* shape, int32_t ndim) "long[]"
%typemap(jstype) (const long long* shape, int32_t ndim) "long[]"
%typemap(javain) (const long long* shape, int32_t ndim) "$javainput"
%typemap(in) (const long long* shape, int32_t ndim) (long long dims[ZERO_MAX_NDIM + 1]) %{
  {
    jsize n = $input ? (*jenv)->GetArrayLength(jenv, $input) : 0;
    if (n > ZERO_MAX_NDIM) n = ZERO_MAX_NDIM + 1; /* rejected by set_shape with a message */
    if (n > 0) (*jenv)->GetLongArrayRegion(jenv, $input, 0, n, (jlong*)dims);
    $1 = dims;
    $2 = (int32_t)($input ? (*jenv)->GetArrayLength(jenv, $input) : 0);
  }
%}
#elif defined(SWIGGO)
%typemap(gotype) (const long long* shape, int32_t ndim) "[]int64"
%typemap(imtype) (const long long* shape, int32_t ndim) "[]int64"
%typemap(in) (const long long* shape, int32_t ndim) %{
  $1 = (long long*)$input.array;
  $2 = (int32_t)$input.len;
%}
#endif

/* zero_load_checkpoint's tag: Go has no nil string, so "" means NULL (the latest); Java passes null itself. */
#if defined(SWIGGO)
%typemap(in) const char* tag %{
  $1 = NULL;
  if ($input.n > 0) {
    $1 = (char*)malloc($input.n + 1);
    memcpy($1, $input.p, $input.n);
    $1[$input.n] = '\0';
  }
%}
%typemap(freearg) const char* tag %{ free($1); %}
#endif

/* ---- What is not wrapped ---------------------------------------------------------------------------------------- */
%ignore zero_string_destroy; /* the string typemaps free what they copy */
%ignore zero_set_log_callback;
%ignore zero_log_fn;
%ignore zero_allocator;
%ignore zero_allocator_init;
%ignore zero_engine_set_allocator;
/* Structs are made by their constructors below, which call these. */
%ignore zero_step_info_init;
%ignore zero_engine_info_init;
%ignore zero_memory_stats_init;
%ignore zero_comm_stats_init;
%ignore zero_param_group_desc_init;
%ignore zero_param_desc_init;
%ignore zero_param_info_init;
%ignore zero_unit_info_init;
%ignore struct_size;
/* Pointer fields of the descriptors are set through the owning setters below. */
%ignore zero_param_group_desc::name;
%ignore zero_param_desc::name;
%ignore zero_param_desc::shape;
%ignore zero_param_desc::ndim;
%ignore zero_param_desc::init_data;
%ignore zero_param_info::shape;
%ignore zero_param_info::name;

/* ---- Structs: constructors that run the init functions --------------------------------------------------------- */
%define ZERO_OUTPUT_STRUCT(TAG, TYPE)
%extend TAG {
  TAG() {
    TYPE* value = (TYPE*)calloc(1, sizeof(TYPE));
    if (value) TYPE##_init_checked(value);
    return value;
  }
  ~TAG() { free($self); }
}
%enddef

%{
/* Each init function with the size this translation unit was compiled with. */
#define ZERO_SWIG_INIT(TYPE, INIT) \
  static void TYPE##_init_checked(TYPE* value) { (void)INIT(value, sizeof(TYPE)); }
ZERO_SWIG_INIT(zero_step_info_t, zero_step_info_init)
ZERO_SWIG_INIT(zero_engine_info_t, zero_engine_info_init)
ZERO_SWIG_INIT(zero_memory_stats_t, zero_memory_stats_init)
ZERO_SWIG_INIT(zero_comm_stats_t, zero_comm_stats_init)
ZERO_SWIG_INIT(zero_param_info_t, zero_param_info_init)
ZERO_SWIG_INIT(zero_unit_info_t, zero_unit_info_init)

/* Descriptors own copies of their strings and shapes: the struct is the first member of a larger block. */
typedef struct {
  zero_param_group_desc_t desc;
  char* name;
} zero_swig_group_block;
typedef struct {
  zero_param_desc_t desc;
  char* name;
  int64_t shape[ZERO_MAX_NDIM];
} zero_swig_param_block;

static char* zero_swig_strdup(const char* text) {
  if (!text) return NULL;
  size_t n = strlen(text) + 1;
  char* copy = (char*)malloc(n);
  if (copy) memcpy(copy, text, n);
  return copy;
}
%}

ZERO_OUTPUT_STRUCT(zero_step_info, zero_step_info_t)
ZERO_OUTPUT_STRUCT(zero_engine_info, zero_engine_info_t)
ZERO_OUTPUT_STRUCT(zero_memory_stats, zero_memory_stats_t)
ZERO_OUTPUT_STRUCT(zero_comm_stats, zero_comm_stats_t)
ZERO_OUTPUT_STRUCT(zero_unit_info, zero_unit_info_t)
ZERO_OUTPUT_STRUCT(zero_param_info, zero_param_info_t)

%extend zero_param_info {
  /* The name is borrowed from the engine: copied out here. */
  const char* param_name() { return $self->name ? $self->name : ""; }
  int64_t dim(int32_t axis) { return (axis >= 0 && axis < ZERO_MAX_NDIM) ? $self->shape[axis] : 0; }
}

%extend zero_param_group_desc {
  zero_param_group_desc() {
    zero_swig_group_block* block = (zero_swig_group_block*)calloc(1, sizeof(zero_swig_group_block));
    if (block) (void)zero_param_group_desc_init(&block->desc, sizeof(block->desc));
    return &block->desc;
  }
  ~zero_param_group_desc() {
    zero_swig_group_block* block = (zero_swig_group_block*)$self;
    free(block->name);
    free(block);
  }
  void set_name(const char* name) {
    zero_swig_group_block* block = (zero_swig_group_block*)$self;
    free(block->name);
    block->name = zero_swig_strdup(name);
    block->desc.name = block->name;
  }
}

%extend zero_param_desc {
  zero_param_desc() {
    zero_swig_param_block* block = (zero_swig_param_block*)calloc(1, sizeof(zero_swig_param_block));
    if (block) {
      (void)zero_param_desc_init(&block->desc, sizeof(block->desc));
      block->desc.shape = block->shape;
    }
    return &block->desc;
  }
  ~zero_param_desc() {
    zero_swig_param_block* block = (zero_swig_param_block*)$self;
    free(block->name);
    free(block);
  }
  void set_name(const char* name) {
    zero_swig_param_block* block = (zero_swig_param_block*)$self;
    free(block->name);
    block->name = zero_swig_strdup(name);
    block->desc.name = block->name;
  }
  /* More than ZERO_MAX_NDIM dimensions: ndim is kept so that zero_engine_add_param rejects it with its message. */
  void set_shape(const long long* shape, int32_t ndim) {
    zero_swig_param_block* block = (zero_swig_param_block*)$self;
    int32_t n = ndim < ZERO_MAX_NDIM ? ndim : ZERO_MAX_NDIM;
    for (int32_t i = 0; i < n; ++i) block->shape[i] = (int64_t)shape[i];
    block->desc.ndim = ndim;
  }
  /* Initial values at `address` (memory from zero_swig_alloc that outlives zero_engine_finalize); 0 for zeros. */
  void set_init_address(int64_t address) { $self->init_data = (const void*)(intptr_t)address; }
}

/* ---- Host memory the layers fill (initial values) --------------------------------------------------------------- */
%inline %{
/* `bytes` of zeroed memory; 0 when none is left. Free with zero_swig_free. */
int64_t zero_swig_alloc(int64_t bytes) { return (int64_t)(intptr_t)calloc(bytes > 0 ? (size_t)bytes : 1, 1); }
void zero_swig_free(int64_t address) { free((void*)(intptr_t)address); }
/* C's exit(): runs the atexit handlers where libzero tells the other ranks this one is leaving and finalises MPI.
 * Go's os.Exit skips them (the Go layer's zero.Exit calls this). */
void zero_swig_exit(int32_t code) { exit(code); }
%}

/* ---- Java: the JNI class loads the native libraries the jar carries --------------------------------------------- */
#if defined(SWIGJAVA)
%pragma(java) jniclasscode=%{
  static {
    org.libzero.internal.NativeLoader.load();
  }
%}
#endif

/* ---- Java: direct ByteBuffers over engine memory ----------------------------------------------------------------- */
#if defined(SWIGJAVA)
%native(directBuffer) jobject directBuffer(jlong address, jlong bytes);
%{
#ifdef __cplusplus
extern "C" {
#endif
/* A direct ByteBuffer over `bytes` bytes at `address` (no copy; the Java layer decides how long it may be used). */
SWIGEXPORT jobject JNICALL Java_org_libzero_internal_ZeroNativeJNI_directBuffer(JNIEnv* jenv, jclass cls,
                                                                               jlong address, jlong bytes) {
  (void)cls;
  return (*jenv)->NewDirectByteBuffer(jenv, (void*)(intptr_t)address, bytes);
}
#ifdef __cplusplus
}
#endif
%}
#endif

/* ---- Go: the error type the status typemap returns ---------------------------------------------------------------- */
#if defined(SWIGGO)
%insert(go_wrapper) %{
// Error is a failed libzero call: its status code, the code's name and libzero's message.
type Error struct {
	Status  int32
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Is makes errors.Is(err, zero.ErrRemote) true for every error of that status (a target without a message).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Status == e.Status && t.Message == ""
}

// newError reads zero_last_error(), which is per OS thread: callers hold runtime.LockOSThread around the call.
func newError(status int32) error {
	if status == 0 {
		return nil
	}
	return &Error{Status: status, Code: Zero_status_string(int(status)), Message: Zero_last_error()}
}
%}
#endif

%include "zero/zero.h"
