
break