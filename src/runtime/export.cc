// libloom.so is made from the layer archives; this file only gives the shared library a source.
// The C API is defined in api.cc (pulled in whole from loom_runtime).
