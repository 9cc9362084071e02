/* Another module, for the guard's tests (tests/guards.rs): CALLER.CALL
 * command [arg ...] runs the command through RedisModule_Call and answers
 * its reply, as any module that writes keys through RM_Call would. It uses
 * only the module API's entry points it names, so it needs no header. */
#include <stddef.h>

typedef struct RedisModuleCtx RedisModuleCtx;
typedef struct RedisModuleString RedisModuleString;
typedef struct RedisModuleCallReply RedisModuleCallReply;
typedef int (*CmdFunc)(RedisModuleCtx *, RedisModuleString **, int);

static int (*GetApi)(const char *, void *);
static int (*SetModuleAttribs)(RedisModuleCtx *, const char *, int, int);
static int (*CreateCommand)(RedisModuleCtx *, const char *, CmdFunc, const char *, int, int, int);
static RedisModuleCallReply *(*Call)(RedisModuleCtx *, const char *, const char *, ...);
static const char *(*StringPtrLen)(const RedisModuleString *, size_t *);
static int (*ReplyWithCallReply)(RedisModuleCtx *, RedisModuleCallReply *);
static int (*ReplyWithError)(RedisModuleCtx *, const char *);
static void (*FreeCallReply)(RedisModuleCallReply *);
static int (*WrongArity)(RedisModuleCtx *);

static int call(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc < 2) return WrongArity(ctx);
    size_t len;
    const char *name = StringPtrLen(argv[1], &len);
    /* "v": the arguments as an array; "E": errors as replies; "!":
     * replicated. */
    RedisModuleCallReply *r = Call(ctx, name, "vE!", argv + 2, (size_t)(argc - 2));
    if (r == NULL) return ReplyWithError(ctx, "ERR CALLER.CALL: the server refused the call");
    ReplyWithCallReply(ctx, r);
    FreeCallReply(r);
    return 0;
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    GetApi = (int (*)(const char *, void *))((void **)ctx)[0];
    if (GetApi("RedisModule_SetModuleAttribs", &SetModuleAttribs) ||
        GetApi("RedisModule_CreateCommand", &CreateCommand) ||
        GetApi("RedisModule_Call", &Call) ||
        GetApi("RedisModule_StringPtrLen", &StringPtrLen) ||
        GetApi("RedisModule_ReplyWithCallReply", &ReplyWithCallReply) ||
        GetApi("RedisModule_ReplyWithError", &ReplyWithError) ||
        GetApi("RedisModule_FreeCallReply", &FreeCallReply) ||
        GetApi("RedisModule_WrongArity", &WrongArity))
        return 1;
    SetModuleAttribs(ctx, "caller", 1, 1);
    return CreateCommand(ctx, "caller.call", call, "write", 0, 0, 0);
}
