// Our own declarations of the subset of the PJRT C API that torch_tpu uses.
//
// Written for this project from the public ABI description (PJRT C API major
// version 0). Only the structs we fill are declared field by field; every
// function-table slot we do not call is an opaque pointer so that the slots we
// do call sit at the right offsets. `struct_size` of an args struct is the
// offset of its last field plus that field's size (TT_PJRT_SIZE below), which
// is what plugins compare against their own.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

#define TT_PJRT_SIZE(type, last) (offsetof(type, last) + sizeof(((type*)nullptr)->last))

struct PJRT_Error;
struct PJRT_Client;
struct PJRT_Device;
struct PJRT_Memory;
struct PJRT_DeviceDescription;
struct PJRT_Executable;
struct PJRT_LoadedExecutable;
struct PJRT_Buffer;
struct PJRT_Event;
struct PJRT_SerializedExecutable;
struct PJRT_Extension_Base;

struct PJRT_Api_Version {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  int major_version;
  int minor_version;
};

// ---- errors
struct PJRT_Error_Destroy_Args { size_t struct_size; PJRT_Extension_Base* ext; PJRT_Error* error; };
struct PJRT_Error_Message_Args {
  size_t struct_size; PJRT_Extension_Base* ext; const PJRT_Error* error;
  const char* message; size_t message_size;
};
struct PJRT_Error_GetCode_Args { size_t struct_size; PJRT_Extension_Base* ext; const PJRT_Error* error; int code; };

// ---- named values (client options, plugin attributes)
enum PJRT_NamedValue_Type { kNV_String = 0, kNV_Int64, kNV_Int64List, kNV_Float, kNV_Bool };
struct PJRT_NamedValue {
  size_t struct_size; PJRT_Extension_Base* ext;
  const char* name; size_t name_size;
  PJRT_NamedValue_Type type;
  union { const char* string_value; int64_t int64_value; const int64_t* int64_array_value; float float_value; bool bool_value; };
  size_t value_size;
};

// ---- plugin
struct PJRT_Plugin_Initialize_Args { size_t struct_size; PJRT_Extension_Base* ext; };
struct PJRT_Plugin_Attributes_Args {
  size_t struct_size; PJRT_Extension_Base* ext; const PJRT_NamedValue* attributes; size_t num_attributes;
};

// ---- events
struct PJRT_Event_Destroy_Args { size_t struct_size; PJRT_Extension_Base* ext; PJRT_Event* event; };
struct PJRT_Event_IsReady_Args { size_t struct_size; PJRT_Extension_Base* ext; PJRT_Event* event; bool is_ready; };
struct PJRT_Event_Await_Args { size_t struct_size; PJRT_Extension_Base* ext; PJRT_Event* event; };

// ---- client
struct PJRT_Client_Create_Args {
  size_t struct_size; PJRT_Extension_Base* ext;
  const PJRT_NamedValue* create_options; size_t num_options;
  void* kv_get_callback; void* kv_get_user_arg; void* kv_put_callback; void* kv_put_user_arg;
  PJRT_Client* client;
  void* kv_try_get_callback; void* kv_try_get_user_arg;  // added in later API minors
};
struct PJRT_Client_Destroy_Args { size_t struct_size; PJRT_Extension_Base* ext; PJRT_Client* client; };
struct PJRT_Client_String_Args {  // PlatformName and PlatformVersion share this layout
  size_t struct_size; PJRT_Extension_Base* ext; PJRT_Client* client; const char* str; size_t str_size;
};
struct PJRT_Client_AddressableDevices_Args {
  size_t struct_size; PJRT_Extension_Base* ext; PJRT_Client* client;
  PJRT_Device* const* devices; size_t num_devices;
};
struct PJRT_Program {
  size_t struct_size; PJRT_Extension_Base* ext; const char* code; size_t code_size; const char* format; size_t format_size;
};
struct PJRT_Client_Compile_Args {
  size_t struct_size; PJRT_Extension_Base* ext; PJRT_Client* client; const PJRT_Program* program;
  const char* compile_options; size_t compile_options_size; PJRT_LoadedExecutable* executable;
};
enum PJRT_Buffer_Type {
  PJRT_T_INVALID = 0, PJRT_T_PRED, PJRT_T_S8, PJRT_T_S16, PJRT_T_S32, PJRT_T_S64,
  PJRT_T_U8, PJRT_T_U16, PJRT_T_U32, PJRT_T_U64, PJRT_T_F16, PJRT_T_F32, PJRT_T_F64,
  PJRT_T_BF16, PJRT_T_C64, PJRT_T_C128,
};
enum PJRT_HostBufferSemantics { kImmutableOnlyDuringCall = 0, kImmutableUntilTransferCompletes = 1 };
struct PJRT_Client_BufferFromHostBuffer_Args {
  size_t struct_size; PJRT_Extension_Base* ext; PJRT_Client* client;
  const void* data; PJRT_Buffer_Type type; const int64_t* dims; size_t num_dims;
  const int64_t* byte_strides; size_t num_byte_strides;
  PJRT_HostBufferSemantics host_buffer_semantics;
  PJRT_Device* device; PJRT_Memory* memory; void* device_layout;
  PJRT_Event* done_with_host_buffer; PJRT_Buffer* buffer;
};

// ---- devices
struct PJRT_DeviceDescription_Id_Args { size_t struct_size; PJRT_Extension_Base* ext; PJRT_DeviceDescription* desc; int id; };
struct PJRT_DeviceDescription_Kind_Args {
  size_t struct_size; PJRT_Extension_Base* ext; PJRT_DeviceDescription* desc; const char* kind; size_t kind_size;
};
struct PJRT_Device_GetDescription_Args { size_t struct_size; PJRT_Extension_Base* ext; PJRT_Device* device; PJRT_DeviceDescription* desc; };
struct PJRT_Device_MemoryStats_Args {
  size_t struct_size; PJRT_Extension_Base* ext; PJRT_Device* device;
  int64_t bytes_in_use;
  int64_t peak_bytes_in_use; bool peak_bytes_in_use_is_set;
  int64_t num_allocs; bool num_allocs_is_set;
  int64_t largest_alloc_size; bool largest_alloc_size_is_set;
  int64_t bytes_limit; bool bytes_limit_is_set;
  int64_t bytes_reserved; bool bytes_reserved_is_set;
  int64_t peak_bytes_reserved; bool peak_bytes_reserved_is_set;
  int64_t bytes_reservable_limit; bool bytes_reservable_limit_is_set;
  int64_t largest_free_block_bytes; bool largest_free_block_bytes_is_set;
};

// ---- executables
struct PJRT_Executable_Destroy_Args { size_t struct_size; PJRT_Extension_Base* ext; PJRT_Executable* executable; };
struct PJRT_LoadedExecutable_Destroy_Args { size_t struct_size; PJRT_Extension_Base* ext; PJRT_LoadedExecutable* executable; };
struct PJRT_LoadedExecutable_GetExecutable_Args {
  size_t struct_size; PJRT_Extension_Base* ext; PJRT_LoadedExecutable* loaded; PJRT_Executable* executable;
};
struct PJRT_Executable_NumOutputs_Args { size_t struct_size; PJRT_Extension_Base* ext; PJRT_Executable* executable; size_t num_outputs; };
struct PJRT_Executable_Serialize_Args {
  size_t struct_size; PJRT_Extension_Base* ext; const PJRT_Executable* executable;
  const char* bytes; size_t bytes_size; PJRT_SerializedExecutable* serialized;
  void (*deleter)(PJRT_SerializedExecutable*);
};
struct PJRT_Executable_DeserializeAndLoad_Args {
  size_t struct_size; PJRT_Extension_Base* ext; PJRT_Client* client;
  const char* bytes; size_t bytes_size; PJRT_LoadedExecutable* loaded;
  const char* overridden_compile_options; size_t overridden_compile_options_size;  // later minors
};
struct PJRT_ExecuteOptions {
  size_t struct_size; PJRT_Extension_Base* ext;
  void* send_callbacks; void* recv_callbacks; size_t num_send_ops; size_t num_recv_ops;
  int launch_id; const int64_t* non_donatable_input_indices; size_t num_non_donatable_input_indices;
  // added in later API minors (0.115 requires them to be present, zeroed)
  void* context; const char* call_location; size_t num_tasks; int* task_ids; int64_t* incarnation_ids;
};
struct PJRT_LoadedExecutable_Execute_Args {
  size_t struct_size; PJRT_Extension_Base* ext; PJRT_LoadedExecutable* executable;
  PJRT_ExecuteOptions* options;
  PJRT_Buffer* const* const* argument_lists; size_t num_devices; size_t num_args;
  PJRT_Buffer** const* output_lists; PJRT_Event** device_complete_events;
  PJRT_Device* execute_device;
};

// ---- buffers
struct PJRT_Buffer_Destroy_Args { size_t struct_size; PJRT_Extension_Base* ext; PJRT_Buffer* buffer; };
struct PJRT_Buffer_ToHostBuffer_Args {
  size_t struct_size; PJRT_Extension_Base* ext; PJRT_Buffer* src; void* host_layout;
  void* dst; size_t dst_size; PJRT_Event* event;
};
struct PJRT_Buffer_OnDeviceSizeInBytes_Args { size_t struct_size; PJRT_Extension_Base* ext; PJRT_Buffer* buffer; size_t size; };
struct PJRT_Buffer_ReadyEvent_Args { size_t struct_size; PJRT_Extension_Base* ext; PJRT_Buffer* buffer; PJRT_Event* event; };
struct PJRT_Buffer_IsOnCpu_Args { size_t struct_size; PJRT_Extension_Base* ext; PJRT_Buffer* buffer; bool is_on_cpu; };
struct PJRT_Buffer_UnsafePointer_Args { size_t struct_size; PJRT_Extension_Base* ext; PJRT_Buffer* buffer; uintptr_t buffer_pointer; };

#define TT_FN(name) PJRT_Error* (*name)(name##_Args*)
typedef void* PJRT_Slot;  // a function we never call

struct PJRT_Api {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Api_Version pjrt_api_version;
  void (*PJRT_Error_Destroy)(PJRT_Error_Destroy_Args*);
  void (*PJRT_Error_Message)(PJRT_Error_Message_Args*);
  TT_FN(PJRT_Error_GetCode);
  TT_FN(PJRT_Plugin_Initialize);
  TT_FN(PJRT_Plugin_Attributes);
  TT_FN(PJRT_Event_Destroy);
  TT_FN(PJRT_Event_IsReady);
  PJRT_Slot PJRT_Event_Error;
  TT_FN(PJRT_Event_Await);
  PJRT_Slot PJRT_Event_OnReady;
  TT_FN(PJRT_Client_Create);
  TT_FN(PJRT_Client_Destroy);
  PJRT_Error* (*PJRT_Client_PlatformName)(PJRT_Client_String_Args*);
  PJRT_Slot PJRT_Client_ProcessIndex;
  PJRT_Error* (*PJRT_Client_PlatformVersion)(PJRT_Client_String_Args*);
  PJRT_Slot PJRT_Client_Devices;
  TT_FN(PJRT_Client_AddressableDevices);
  PJRT_Slot PJRT_Client_LookupDevice;
  PJRT_Slot PJRT_Client_LookupAddressableDevice;
  PJRT_Slot PJRT_Client_AddressableMemories;
  TT_FN(PJRT_Client_Compile);
  PJRT_Slot PJRT_Client_DefaultDeviceAssignment;
  TT_FN(PJRT_Client_BufferFromHostBuffer);
  TT_FN(PJRT_DeviceDescription_Id);
  PJRT_Slot PJRT_DeviceDescription_ProcessIndex;
  PJRT_Slot PJRT_DeviceDescription_Attributes;
  TT_FN(PJRT_DeviceDescription_Kind);
  PJRT_Slot PJRT_DeviceDescription_DebugString;
  PJRT_Slot PJRT_DeviceDescription_ToString;
  TT_FN(PJRT_Device_GetDescription);
  PJRT_Slot PJRT_Device_IsAddressable;
  PJRT_Slot PJRT_Device_LocalHardwareId;
  PJRT_Slot PJRT_Device_AddressableMemories;
  PJRT_Slot PJRT_Device_DefaultMemory;
  TT_FN(PJRT_Device_MemoryStats);
  PJRT_Slot PJRT_Memory_Id;
  PJRT_Slot PJRT_Memory_Kind;
  PJRT_Slot PJRT_Memory_DebugString;
  PJRT_Slot PJRT_Memory_ToString;
  PJRT_Slot PJRT_Memory_AddressableByDevices;
  TT_FN(PJRT_Executable_Destroy);
  PJRT_Slot PJRT_Executable_Name;
  PJRT_Slot PJRT_Executable_NumReplicas;
  PJRT_Slot PJRT_Executable_NumPartitions;
  TT_FN(PJRT_Executable_NumOutputs);
  PJRT_Slot PJRT_Executable_SizeOfGeneratedCodeInBytes;
  PJRT_Slot PJRT_Executable_GetCostAnalysis;
  PJRT_Slot PJRT_Executable_OutputMemoryKinds;
  PJRT_Slot PJRT_Executable_OptimizedProgram;
  TT_FN(PJRT_Executable_Serialize);
  TT_FN(PJRT_LoadedExecutable_Destroy);
  TT_FN(PJRT_LoadedExecutable_GetExecutable);
  PJRT_Slot PJRT_LoadedExecutable_AddressableDevices;
  PJRT_Slot PJRT_LoadedExecutable_Delete;
  PJRT_Slot PJRT_LoadedExecutable_IsDeleted;
  TT_FN(PJRT_LoadedExecutable_Execute);
  TT_FN(PJRT_Executable_DeserializeAndLoad);
  PJRT_Slot PJRT_LoadedExecutable_Fingerprint;
  TT_FN(PJRT_Buffer_Destroy);
  PJRT_Slot PJRT_Buffer_ElementType;
  PJRT_Slot PJRT_Buffer_Dimensions;
  PJRT_Slot PJRT_Buffer_UnpaddedDimensions;
  PJRT_Slot PJRT_Buffer_DynamicDimensionIndices;
  PJRT_Slot PJRT_Buffer_GetMemoryLayout;
  TT_FN(PJRT_Buffer_OnDeviceSizeInBytes);
  PJRT_Slot PJRT_Buffer_Device;
  PJRT_Slot PJRT_Buffer_Memory;
  PJRT_Slot PJRT_Buffer_Delete;
  PJRT_Slot PJRT_Buffer_IsDeleted;
  PJRT_Slot PJRT_Buffer_CopyToDevice;
  TT_FN(PJRT_Buffer_ToHostBuffer);
  TT_FN(PJRT_Buffer_IsOnCpu);
  TT_FN(PJRT_Buffer_ReadyEvent);
  TT_FN(PJRT_Buffer_UnsafePointer);
  // Later slots are not used.
};
#undef TT_FN

typedef const PJRT_Api* (*GetPjrtApiFn)();

}  // extern "C"

// Every slot we call sits at its number in the public ABI (function pointers
// counted from PJRT_Error_Destroy = 0; the table only grows at its end). A
// miscounted declaration above fails to compile here.
#define TT_SLOT(name, index)                                                                            \
  static_assert(offsetof(PJRT_Api, name) == offsetof(PJRT_Api, PJRT_Error_Destroy) + (index) * sizeof(void*), \
                #name " is not PJRT_Api slot " #index)
TT_SLOT(PJRT_Error_Destroy, 0);
TT_SLOT(PJRT_Error_Message, 1);
TT_SLOT(PJRT_Error_GetCode, 2);
TT_SLOT(PJRT_Plugin_Initialize, 3);
TT_SLOT(PJRT_Plugin_Attributes, 4);
TT_SLOT(PJRT_Event_Destroy, 5);
TT_SLOT(PJRT_Event_IsReady, 6);
TT_SLOT(PJRT_Event_Await, 8);
TT_SLOT(PJRT_Client_Create, 10);
TT_SLOT(PJRT_Client_Destroy, 11);
TT_SLOT(PJRT_Client_PlatformName, 12);
TT_SLOT(PJRT_Client_PlatformVersion, 14);
TT_SLOT(PJRT_Client_AddressableDevices, 16);
TT_SLOT(PJRT_Client_Compile, 20);
TT_SLOT(PJRT_Client_BufferFromHostBuffer, 22);
TT_SLOT(PJRT_DeviceDescription_Id, 23);
TT_SLOT(PJRT_DeviceDescription_Kind, 26);
TT_SLOT(PJRT_Device_GetDescription, 29);
TT_SLOT(PJRT_Device_MemoryStats, 34);
TT_SLOT(PJRT_Executable_Destroy, 40);
TT_SLOT(PJRT_Executable_NumOutputs, 44);
TT_SLOT(PJRT_Executable_Serialize, 49);
TT_SLOT(PJRT_LoadedExecutable_Destroy, 50);
TT_SLOT(PJRT_LoadedExecutable_GetExecutable, 51);
TT_SLOT(PJRT_LoadedExecutable_Execute, 55);
TT_SLOT(PJRT_Executable_DeserializeAndLoad, 56);
TT_SLOT(PJRT_Buffer_Destroy, 58);
TT_SLOT(PJRT_Buffer_OnDeviceSizeInBytes, 64);
TT_SLOT(PJRT_Buffer_ToHostBuffer, 70);
TT_SLOT(PJRT_Buffer_IsOnCpu, 71);
TT_SLOT(PJRT_Buffer_ReadyEvent, 72);
TT_SLOT(PJRT_Buffer_UnsafePointer, 73);
#undef TT_SLOT

// The first API minor version whose table holds every slot declared above
// (Device_MemoryStats and Executable_DeserializeAndLoad are the newest we use).
constexpr int kTtMinPjrtMinor = 40;
