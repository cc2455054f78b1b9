package torchpickle

// Pickle opcodes (CPython Lib/pickle.py). The machine accepts only those with a
// case in machine.step; the rest are listed so errors can name them.
const (
	opMARK             = '('
	opSTOP             = '.'
	opPOP              = '0'
	opPOP_MARK         = '1'
	opDUP              = '2'
	opFLOAT            = 'F'
	opINT              = 'I'
	opBININT           = 'J'
	opBININT1          = 'K'
	opLONG             = 'L'
	opBININT2          = 'M'
	opNONE             = 'N'
	opPERSID           = 'P'
	opBINPERSID        = 'Q'
	opREDUCE           = 'R'
	opSTRING           = 'S'
	opBINSTRING        = 'T'
	opSHORT_BINSTRING  = 'U'
	opUNICODE          = 'V'
	opBINUNICODE       = 'X'
	opAPPEND           = 'a'
	opBUILD            = 'b'
	opGLOBAL           = 'c'
	opDICT             = 'd'
	opEMPTY_DICT       = '}'
	opAPPENDS          = 'e'
	opGET              = 'g'
	opBINGET           = 'h'
	opINST             = 'i'
	opLONG_BINGET      = 'j'
	opLIST             = 'l'
	opEMPTY_LIST       = ']'
	opOBJ              = 'o'
	opPUT              = 'p'
	opBINPUT           = 'q'
	opLONG_BINPUT      = 'r'
	opSETITEM          = 's'
	opTUPLE            = 't'
	opEMPTY_TUPLE      = ')'
	opSETITEMS         = 'u'
	opBINFLOAT         = 'G'
	opPROTO            = 0x80
	opNEWOBJ           = 0x81
	opEXT1             = 0x82
	opEXT2             = 0x83
	opEXT4             = 0x84
	opTUPLE1           = 0x85
	opTUPLE2           = 0x86
	opTUPLE3           = 0x87
	opNEWTRUE          = 0x88
	opNEWFALSE         = 0x89
	opLONG1            = 0x8a
	opLONG4            = 0x8b
	opBINBYTES         = 'B'
	opSHORT_BINBYTES   = 'C'
	opSHORT_BINUNICODE = 0x8c
	opBINUNICODE8      = 0x8d
	opBINBYTES8        = 0x8e
	opEMPTY_SET        = 0x8f
	opADDITEMS         = 0x90
	opFROZENSET        = 0x91
	opNEWOBJ_EX        = 0x92
	opSTACK_GLOBAL     = 0x93
	opMEMOIZE          = 0x94
	opFRAME            = 0x95
	opBYTEARRAY8       = 0x96
	opNEXT_BUFFER      = 0x97
	opREADONLY_BUFFER  = 0x98
)

func opName(c byte) string {
	switch c {
	case opMARK:
		return "MARK"
	case opSTOP:
		return "STOP"
	case opPOP:
		return "POP"
	case opPOP_MARK:
		return "POP_MARK"
	case opDUP:
		return "DUP"
	case opFLOAT:
		return "FLOAT"
	case opINT:
		return "INT"
	case opBININT:
		return "BININT"
	case opBININT1:
		return "BININT1"
	case opLONG:
		return "LONG"
	case opBININT2:
		return "BININT2"
	case opNONE:
		return "NONE"
	case opPERSID:
		return "PERSID"
	case opBINPERSID:
		return "BINPERSID"
	case opREDUCE:
		return "REDUCE"
	case opSTRING:
		return "STRING"
	case opBINSTRING:
		return "BINSTRING"
	case opSHORT_BINSTRING:
		return "SHORT_BINSTRING"
	case opUNICODE:
		return "UNICODE"
	case opBINUNICODE:
		return "BINUNICODE"
	case opAPPEND:
		return "APPEND"
	case opBUILD:
		return "BUILD"
	case opGLOBAL:
		return "GLOBAL"
	case opDICT:
		return "DICT"
	case opEMPTY_DICT:
		return "EMPTY_DICT"
	case opAPPENDS:
		return "APPENDS"
	case opGET:
		return "GET"
	case opBINGET:
		return "BINGET"
	case opINST:
		return "INST"
	case opLONG_BINGET:
		return "LONG_BINGET"
	case opLIST:
		return "LIST"
	case opEMPTY_LIST:
		return "EMPTY_LIST"
	case opOBJ:
		return "OBJ"
	case opPUT:
		return "PUT"
	case opBINPUT:
		return "BINPUT"
	case opLONG_BINPUT:
		return "LONG_BINPUT"
	case opSETITEM:
		return "SETITEM"
	case opTUPLE:
		return "TUPLE"
	case opEMPTY_TUPLE:
		return "EMPTY_TUPLE"
	case opSETITEMS:
		return "SETITEMS"
	case opBINFLOAT:
		return "BINFLOAT"
	case opPROTO:
		return "PROTO"
	case opNEWOBJ:
		return "NEWOBJ"
	case opEXT1:
		return "EXT1"
	case opEXT2:
		return "EXT2"
	case opEXT4:
		return "EXT4"
	case opTUPLE1:
		return "TUPLE1"
	case opTUPLE2:
		return "TUPLE2"
	case opTUPLE3:
		return "TUPLE3"
	case opNEWTRUE:
		return "NEWTRUE"
	case opNEWFALSE:
		return "NEWFALSE"
	case opLONG1:
		return "LONG1"
	case opLONG4:
		return "LONG4"
	case opBINBYTES:
		return "BINBYTES"
	case opSHORT_BINBYTES:
		return "SHORT_BINBYTES"
	case opSHORT_BINUNICODE:
		return "SHORT_BINUNICODE"
	case opBINUNICODE8:
		return "BINUNICODE8"
	case opBINBYTES8:
		return "BINBYTES8"
	case opEMPTY_SET:
		return "EMPTY_SET"
	case opADDITEMS:
		return "ADDITEMS"
	case opFROZENSET:
		return "FROZENSET"
	case opNEWOBJ_EX:
		return "NEWOBJ_EX"
	case opSTACK_GLOBAL:
		return "STACK_GLOBAL"
	case opMEMOIZE:
		return "MEMOIZE"
	case opFRAME:
		return "FRAME"
	case opBYTEARRAY8:
		return "BYTEARRAY8"
	case opNEXT_BUFFER:
		return "NEXT_BUFFER"
	case opREADONLY_BUFFER:
		return "READONLY_BUFFER"
	}
	return "unknown"
}
